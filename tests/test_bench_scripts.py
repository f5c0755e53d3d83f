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


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ("0-1\n", {0, 1}),  # two threads of one core, as a range
        ("0,8\n", {0, 8}),  # siblings numbered apart, as a list
        ("2-3,10-11\n", {2, 3, 10, 11}),  # four threads of one core (ranges in a list)
        ("5\n", {5}),  # no SMT: the core alone
        ("4,5-6,12\n", {4, 5, 6, 12}),  # a list mixing single cores and a range
    ],
)
def test_siblings_reads_sysfs_thread_siblings_lists(tmp_path, monkeypatch, listed, expected):
    # The kernel's cpulist format (Documentation/ABI: ranges "a-b" in a comma-separated list),
    # read from a fake sysfs tree; the asked core is in its own list there.
    monkeypatch.syspath_prepend(str(BENCH))
    import bench

    core = min(expected)
    topology = tmp_path / f"cpu{core}" / "topology"
    topology.mkdir(parents=True)
    (topology / "thread_siblings_list").write_text(listed)
    assert bench.siblings(core, tmp_path) == expected


def test_siblings_is_the_core_alone_where_sysfs_does_not_say(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench

    (tmp_path / "cpu3").mkdir()  # a core without a topology folder (and cpu7 not at all)
    assert bench.siblings(3, tmp_path) == {3}
    assert bench.siblings(7, tmp_path) == {7}
    # The core is counted even if its list (wrongly) leaves it out.
    topology = tmp_path / "cpu9" / "topology"
    topology.mkdir(parents=True)
    (topology / "thread_siblings_list").write_text("1-2\n")
    assert bench.siblings(9, tmp_path) == {1, 2, 9}
    # An empty list says nothing either.
    (topology / "thread_siblings_list").write_text("\n")
    assert bench.siblings(9, tmp_path) == {9}
