"""The Python worker package against the real proxy: nothing a hook raises ends a worker, and
large batches sent ahead cross large results on one connection without a deadlock."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HOSTILE = str(Path(__file__).resolve().parent / "workers" / "hostile.py")


def test_a_message_with_a_lone_surrogate_is_a_readable_500_and_the_worker_lives_on(
    corral_factory,
):
    proxy = corral_factory("--max-wait-ms=0", worker=HOSTILE)
    before = proxy.post({"n": 1})
    assert before.status_code == 200
    failed = proxy.post({"surrogate": True})
    assert failed.status_code == 500
    assert failed.json()["message"] == "ValueError: cannot open photo-\\xff.jpg"
    after = proxy.post({"n": 2})
    assert after.status_code == 200
    assert after.json()["pid"] == before.json()["pid"]


def test_a_base_exception_in_forward_is_a_500_and_the_worker_lives_on(corral_factory):
    proxy = corral_factory("--max-wait-ms=0", worker=HOSTILE)
    before = proxy.post({"n": 1})
    failed = proxy.post({"base": True})
    assert failed.status_code == 500
    assert failed.json()["message"].startswith("Abort: unwound")
    after = proxy.post({"n": 2})
    assert after.status_code == 200
    assert after.json()["pid"] == before.json()["pid"]


@pytest.mark.timeout(180)
def test_large_batches_sent_ahead_cross_large_results(corral_factory):
    """Batches of four 256 KiB requests (over a socket buffer) are sent ahead while the worker
    writes results of four 1 MiB outputs. A worker that stops reading while it writes, facing a
    proxy that finishes writing a batch before it reads, waits forever: every request a 408."""
    proxy = corral_factory(
        "--max-batch-size=4", "--max-wait-ms=5", "--timeout-ms=30000", worker=HOSTILE
    )
    pad = "p" * (256 * 1024)

    def post(n):
        item = {"n": n, "out_bytes": 1024 * 1024, "sleep_ms": 100, "pad": pad}
        return proxy.post(item)

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(post, range(32)))
    assert [r.status_code for r in responses] == [200] * 32
    assert all(len(r.json()["out"]) == 1024 * 1024 for r in responses)
    assert len({r.json()["pid"] for r in responses}) == 1
