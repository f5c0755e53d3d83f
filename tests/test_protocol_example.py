"""The example worker of PROTOCOL.md ("A worker in a few lines"), run as written against the real
proxy: the document's own code must serve, exit 0 on `shutdown`, and exit non-zero with the
message on `reject`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

PROTOCOL = Path(__file__).resolve().parents[1] / "worker-protocol" / "PROTOCOL.md"


@pytest.fixture
def example(tmp_path) -> Path:
    text = PROTOCOL.read_text(encoding="utf-8")
    found = re.search(r"^## A worker in a few lines.*?^```python\n(.*?)^```", text, re.S | re.M)
    assert found, "PROTOCOL.md has no example worker"
    path = tmp_path / "example_worker.py"
    path.write_text(found.group(1), encoding="utf-8")
    return path


def run_example(example: Path, proxy, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(example)],
        env={**os.environ, "CORRAL_SOCKET": str(proxy.socket), **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(worker: subprocess.Popen) -> tuple[int, str]:
    """The worker's exit status and its stderr (killed if it has not exited within 30 s)."""
    try:
        _, stderr = worker.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        _, stderr = worker.communicate()
        raise AssertionError(f"the example worker did not exit; stderr:\n{stderr}") from None
    return worker.returncode, stderr


def test_the_example_worker_serves_then_exits_cleanly_on_shutdown(corral_factory, example):
    proxy = corral_factory("--max-wait-ms=0", worker=None)
    worker = run_example(example, proxy)
    proxy.wait_for_log(r"worker connected")
    assert proxy.post({"x": [1, "two"]}).json() == {"x": [1, "two"]}
    packed = msgpack.packb([1.5, None])
    headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    answer = proxy.client.post("/infer", content=packed, headers=headers)
    assert answer.status_code == 200 and answer.content == packed

    assert proxy.stop() == 0  # SIGTERM: the proxy sends the worker `shutdown`
    status, stderr = finish(worker)
    assert status == 0, stderr


def test_the_example_worker_exits_with_the_message_when_refused(corral_factory, example):
    proxy = corral_factory("--max-wait-ms=0", worker=None)
    worker = run_example(example, proxy, CORRAL_STAGE="resize")
    status, stderr = finish(worker)
    assert status != 0
    assert 'unknown stage "resize"' in stderr, stderr
    proxy.wait_for_log(r"worker refused")
