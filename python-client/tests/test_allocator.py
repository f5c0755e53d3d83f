"""The worker's malloc settings (``_allocator``): large items in flight together reuse their
pages instead of being faulted in afresh each time, and the environment's own settings win."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = str(Path(__file__).resolve().parents[1] / "src")

# Three 10 MB items at a time, ten times over, after one round to warm up: the page faults of
# those ten rounds.
ROUNDS = """
import resource
from corral import _allocator
_allocator.tune()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def one_round():
    items = [b"x" * 10_000_000 for _ in range(3)]
    del items
one_round()
before = faults()
for _ in range(10):
    one_round()
print(faults() - before)
"""


def glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


def faults(**env: str) -> int:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"
    }
    environment.update(env, PYTHONPATH=SOURCE)
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS], env=environment, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not glibc(), reason="glibc only")
def test_large_items_reuse_their_pages_unless_the_environment_says_otherwise():
    # 30 items of 10 MB are 73,000 pages: with the settings they come from pages already in use.
    assert faults() < 1000
    # A threshold of the environment's own is kept: here every item is mapped and faulted afresh.
    assert faults(MALLOC_MMAP_THRESHOLD_="131072") > 30_000
    assert faults(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072") > 30_000
    # Another malloc tunable (a container's arena_max) leaves the thresholds to the settings.
    assert faults(GLIBC_TUNABLES="glibc.malloc.arena_max=2") < 1000


def test_a_plain_worker_tunes_as_it_starts_serving_and_nothing_else_does(monkeypatch, tmp_path):
    import corral
    from corral import _allocator, _shared_memory
    from corral.testing import FakeProxy

    calls = []
    monkeypatch.setattr(_allocator, "tune", lambda: calls.append("tuned"))
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()  # a proxy pid that no longer exists: serving returns at once
    monkeypatch.setenv("CORRAL_PROXY_PID", str(gone.pid))

    class Plain(corral.Worker):
        def forward(self, batch):
            return batch

    class Streaming(corral.Worker):
        def forward(self, batch):
            yield [corral.END] * len(batch)

    with FakeProxy(Plain()) as proxy:  # a test double serves without tuning its process
        assert proxy.infer([1])[0].value == 1
    assert calls == []
    Streaming()._run_forever(str(tmp_path / "none.sock"))
    assert calls == []
    Plain()._run_forever(str(tmp_path / "none.sock"))
    assert calls == (["tuned"] if _shared_memory.features() else [])
