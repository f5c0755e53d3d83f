"""The benchmark programs still run against the code they measure: each answers --help (its
imports and the modules it shares with the others), and the one that drives the worker
package's own serve loop completes a tiny run. No figures are judged here: speed lives in
BENCHMARKS.md. (bench/worker_batch.py once called a package method renamed since, and nothing
noticed until it was next run.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT

BENCH = ROOT / "bench"
# Workers and servers the programs start, and the GPU model (it needs torch): not programs.
NOT_PROGRAMS = {"workloads.py", "gpu_model.py", "gpu_worker.py", "loopback_server.py"}
PROGRAMS = sorted(
    p.name
    for p in BENCH.glob("*.py")
    if p.name not in NOT_PROGRAMS
    and not p.name.startswith("mosec_")
    and not p.name.endswith("_worker.py")
)


def test_the_list_of_programs_is_not_empty():
    assert "bench.py" in PROGRAMS and "worker_batch.py" in PROGRAMS


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_benchmark_program_answers_help(program):
    done = subprocess.run(
        [sys.executable, str(BENCH / program), "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize("payload", ["seed", "tensor"])
def test_the_worker_batch_benchmark_completes_a_tiny_run(tmp_path, payload):
    out = tmp_path / "report.md"
    done = subprocess.run(
        [sys.executable, str(BENCH / "worker_batch.py"), "--sizes", "1,4", "--batches", "5",
         "--runs", "1", "--payload", payload, "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| 4 | current |" in out.read_text()


def test_the_gpu_runs_load_generator_keeps_off_the_pinned_workers_cores(monkeypatch):
    # Four logical cores, 2 and 3 one physical core: one pinned worker takes core 3, so the
    # load generator gets 0 and 1 (not 2, its SMT sibling); two take 2 and 3 (and 0, 1 remain);
    # with every core pinned the run refuses rather than measure something else.
    monkeypatch.syspath_prepend(str(BENCH))
    import bench
    import gpu

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    monkeypatch.setattr(bench, "siblings", lambda core: {2, 3} if core in (2, 3) else {core})
    assert gpu.load_prefix("all", 1) == []
    assert gpu.load_prefix("away", 1) == ["taskset", "-c", "0,1"]
    assert gpu.load_prefix("away", 2) == ["taskset", "-c", "0,1"]
    with pytest.raises(SystemExit, match="no core is left"):
        gpu.load_prefix("away", 4)
