"""The measured GPU run: a real architecture on a real GPU, behind Corral, behind MOSEC, and in
process, in one run.

The model is torchvision's ResNet-50 built from its definition with random weights (the cost of
the real architecture, no download), in half precision on `cuda:0`. Each request is a tiny JSON
object; the worker makes its image tensor on the GPU, so the run measures serving (queueing,
batching, the hop to the worker), not the upload of 600 KB images. For max batch 32 and 128:

- the limit: the model's own batch throughput in process on the same device (items/s); with
  `corral-pinned` measured, the faster of the loop as it is and the loop pinned to the core a
  pinned worker gets;
- Corral (`--gpus 0 --workers-per-gpu N`) and MOSEC (N workers), for N = 1 and 2 worker
  processes on the GPU, at 1, 32 and 256 closed-loop clients (oha): items/s and p50/p99, with
  the GPU's utilisation sampled from nvidia-smi meanwhile. With BENCH_GAPS=1 set, each Corral
  worker's log (in the run's temporary folder) says where its time goes (bench/gpu_worker.py).

Targets (issue: workers on accelerators): Corral ≥ 90% of the in-process limit at 256 clients
and ≥ 1.5× MOSEC. Without torch or a GPU the script says so and exits 2: it is never faked on
CPU. Run: `make bench-gpu`, or on a machine without the Makefile's tools,
`python bench/gpu.py --corral target/release/corral --oha bench/.tools/bin/oha` (needs the
`corral` and `mosec` packages installed; offline, carry MOSEC's wheel with those of `msgspec`,
`defspec` and `offapi`: MOSEC imports `offapi` as it starts, and exits without it;
`make gpu-carry` gathers them, and bench/gpu_device.sh installs them there). The results
replace the "GPU" section of BENCHMARKS.md.

`--load-cpus away` runs the load generator off the last N cores and their SMT siblings, the
cores `corral-pinned` gives its workers, for every system alike: as when the clients are on
other machines. By default (`all`) it may run on every core, the pinned worker's too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

BODY = '{"seed": 1}'
CLIENTS = [1, 32, 256]
BATCHES = [32, 128]
# One worker process, and two: a model whose batch is bound by the CPU launching its kernels
# leaves the GPU idle between batches unless a second process fills the gaps.
WORKERS = [1, 2]
WARMUP_S = 3


def require_gpu() -> str:
    """The GPU's name; exits 2 saying why when there is none to measure on."""
    try:
        import torch
    except ImportError:
        print("bench/gpu.py: torch is not installed; this run needs torch with CUDA and a GPU")
        raise SystemExit(2) from None
    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device is available; the GPU run is not faked on CPU")
        raise SystemExit(2)
    return torch.cuda.get_device_name(0)


def in_process(
    max_batch: int, seconds: float, repeats: int = 1, cpus: set[int] | None = None
) -> tuple[float, float, list[float]]:
    """The model's own throughput at `max_batch` on cuda:0, items/s (after a warm-up; with
    `repeats`, the median of that many runs), the GPU's median utilisation meanwhile, and the
    time each batch took (seconds). With `cpus`, the launching thread runs on those cores
    alone while it is timed, as a pinned worker does."""
    import bench
    import gpu_model

    model = gpu_model.Model()
    for _ in range(10):
        model.run(max_batch)
    rates, times = [], []
    allowed = os.sched_getaffinity(0)
    with Utilisation() as gpu:
        # Pinned after the sampler's thread started, so that it (and nvidia-smi) stay off
        # the core; this thread alone launches the kernels.
        if cpus:
            os.sched_setaffinity(0, cpus)
        try:
            for _ in range(repeats):
                done, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    began = time.perf_counter()
                    model.run(max_batch)
                    times.append(time.perf_counter() - began)
                    done += max_batch
                rates.append(done / (time.perf_counter() - start))
        finally:
            os.sched_setaffinity(0, allowed)
    return bench.lower_median(rates), gpu.median(), times


def limits(
    max_batch: int, seconds: float, repeats: int, pinned: bool
) -> tuple[float, list[tuple[str, float, float, list[float]]]]:
    """The in-process limit at `max_batch`, and each loop measured: (name, items/s, GPU
    utilisation, batch times). With `pinned` (a pinned system is measured), the loop runs a
    second time on the core a pinned worker gets, and the limit is the faster of the two: where
    launching kernels bounds the batch (max batch 32), an unpinned loop is slowed by whatever
    shares its core, and a pinned worker beat it (109% on an H100)."""
    import bench

    loops = [("in process", *in_process(max_batch, seconds, repeats))]
    if pinned:
        core = set(bench.last_cores(1))
        loops.append(("in process, pinned", *in_process(max_batch, seconds, repeats, core)))
    return max(rate for _, rate, _, _ in loops), loops


def spread(seconds: list[float]) -> str:
    """Durations as "median / mean / p99 ms" (the form of every timing line of the GPU run)."""
    p99 = sorted(seconds)[int(len(seconds) * 0.99)]
    return (
        f"{statistics.median(seconds) * 1e3:.2f} / {statistics.fmean(seconds) * 1e3:.2f} / "
        f"{p99 * 1e3:.2f} ms"
    )


class Utilisation:
    """Samples nvidia-smi's GPU utilisation every half second while in use."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self._stop.wait(0.5):
            out = subprocess.run(query, capture_output=True, text=True, check=False).stdout
            if out.strip():
                self.samples.append(float(out.split()[0]))

    def __enter__(self) -> Utilisation:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


def systems(args, max_batch: int, workers: int):
    import bench

    python = sys.executable
    # BENCH_GAPS: Corral's workers log where their time goes (see the section's timings).
    env = {"BENCH_MAX_BATCH": str(max_batch), "BENCH_WORKERS": str(workers), "BENCH_GAPS": "1"}
    corral = [
        args.corral, "--listen", "127.0.0.1:18600", "--socket", "gpu.sock", "--gpus", "0",
        "--workers-per-gpu", str(workers), "--max-batch-size", str(max_batch),
        "--max-wait-ms", "5", "--queue-capacity", "4096", "--timeout-ms", "30000",
        "--", python, str(HERE / "gpu_worker.py"),
    ]  # fmt: skip
    # The same, each worker pinned to a core of its own (the last cores this process may use).
    cores = ",".join(map(str, bench.last_cores(workers)))
    pinned = [*corral[:-3], "--cpus", cores, *corral[-3:]]
    mosec = [
        python, str(HERE / "mosec_gpu.py"), "--port", "18601", "--address", "127.0.0.1",
        "--timeout", "30000", "--log-level", "warning",
    ]  # fmt: skip
    found = [
        bench.System("corral", corral, "http://127.0.0.1:18600/infer", ("corral",), env=env),
        bench.System("corral-pinned", pinned, "http://127.0.0.1:18600/infer", ("corral",), env=env),
        bench.System("mosec", mosec, "http://127.0.0.1:18601/inference", ("mosec",), env=env),
    ]
    wanted = args.systems.split(",")
    unknown = set(wanted) - {system.name for system in found}
    if unknown:
        raise SystemExit(f"--systems: unknown {', '.join(sorted(unknown))}")
    return [system for system in found if system.name in wanted]


def measure(
    args, system, clients: int, repeats: int = 1, prefix: list[str] | tuple[str, ...] = ()
) -> tuple[float, float, float]:
    """Closed-loop load at `clients` for `args.seconds`: items/s, p50 and p99 ms; with
    `repeats`, those of the run of median items/s among that many; `prefix` goes before the
    load generator's command."""
    import bench

    runs = []
    for _ in range(repeats):
        report = bench.oha(args.oha, system.url, args.seconds, clients, None, BODY, prefix)
        runs.append((bench.answered(report)[0] / args.seconds, report))
    rate = bench.lower_median([r for r, _ in runs])
    report = next(report for r, report in runs if r == rate)
    latency = report.get("latencyPercentiles", {})
    return rate, (latency.get("p50") or 0) * 1000, (latency.get("p99") or 0) * 1000


def point(
    args,
    system,
    max_batch: int,
    workers: int,
    clients: int,
    limit: float,
    repeats: int = 1,
    load: list[str] | tuple[str, ...] = (),
) -> tuple[str, float]:
    """One measured point: its table row and its items/s; with `repeats`, the run of median
    items/s among that many (its latencies with it); `load` goes before the load generator."""
    with Utilisation() as gpu:
        rate, p50, p99 = measure(args, system, clients, repeats, load)
    row = (
        f"| {max_batch} | {workers} | {system.name} | {clients} | {rate:,.0f} | {rate / limit:.2f}"
        f" | {p50:.1f} | {p99:.1f} | {gpu.median():.0f} |"
    )
    return row, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oha", default=str(HERE / ".tools" / "bin" / "oha"))
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of each 256-client point (median kept)"
    )
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="max batch sizes")
    parser.add_argument(
        "--workers",
        default=",".join(map(str, WORKERS)),
        help="worker processes on the GPU, for each server (a list: each is measured)",
    )
    parser.add_argument(
        "--systems",
        default="corral,mosec",
        help="of corral, corral-pinned (each worker on a core of its own: --cpus) and mosec",
    )
    parser.add_argument(
        "--clients",
        default=",".join(map(str, CLIENTS)),
        help="closed-loop clients per point (a list; the targets are judged at the largest)",
    )
    parser.add_argument(
        "--load-cpus",
        choices=("all", "away"),
        default="all",
        help="where the load generator runs: every core, or away from the pinned workers' cores",
    )
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()
    device = require_gpu()
    clients_list = [int(c) for c in args.clients.split(",")]
    most = max(clients_list)

    import bench

    workdir = Path(tempfile.mkdtemp(prefix="corral-gpu-"))
    print(f"servers' logs (and BENCH_GAPS lines) in {workdir}", flush=True)
    rows = [
        "| max batch | workers | system | clients | items/s | ÷ in-process limit | p50 ms | p99 ms"
        " | GPU utilisation (median %) |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    verdicts: list[str] = []
    # The loop's time per batch beside the workers' BENCH_GAPS lines: `forward` in a worker
    # against the same batch in the loop, and the time between two batches.
    timings: list[str] = []
    for max_batch in [int(b) for b in args.batches.split(",")]:
        pinned = "corral-pinned" in args.systems.split(",")
        limit, loops = limits(max_batch, args.seconds, args.repeats, pinned)
        for name, rate, busy, times in loops:
            timings.append(f"max batch {max_batch}, {name}: a batch {spread(times)}")
            print(timings[-1], flush=True)
            label = f"{name} (the limit)" if rate == limit else name
            rows.append(
                f"| {max_batch} | — | {label} | — | {rate:,.0f} | {rate / limit:.2f} | — | — "
                f"| {busy:.0f} |"
            )
            print(rows[-1], flush=True)
        for workers in [int(w) for w in args.workers.split(",")]:
            at_most: dict[str, float] = {}
            load = load_prefix(args.load_cpus, workers)
            for system in systems(args, max_batch, workers):
                # A log per server and setting (bench/gpu_worker.py's BENCH_GAPS lines land there).
                bench.start(system, f"gpu-b{max_batch}-w{workers}", workdir, body=BODY)
                try:
                    # Warm-up at full load: the batch shapes the measured points will use.
                    bench.oha(args.oha, system.url, WARMUP_S, most, None, BODY, load)
                    for clients in clients_list:
                        # The targets' point is measured `--repeats` times (its median kept).
                        repeats = args.repeats if clients == most else 1
                        row, rate = point(
                            args, system, max_batch, workers, clients, limit, repeats, load
                        )
                        rows.append(row)
                        print(row, flush=True)
                        report(args, device, most, rows, verdicts, timings, done=False)
                        if clients == most:
                            at_most[system.name] = rate
                finally:
                    bench.stop(system)
                if system.name != "mosec":
                    timings.append(
                        f"max batch {max_batch}, {workers} worker(s), {system.name}: "
                        f"{last_gaps(system.log)} (the log's last line, at {most} clients)"
                    )
            mosec = at_most.get("mosec")
            for name, rate in at_most.items():
                if name != "mosec":
                    versus = f"{rate / mosec:.2f}× MOSEC" if mosec else "MOSEC not measured"
                    verdicts.append(
                        f"max batch {max_batch}, {workers} worker(s), {most} clients: {name} "
                        f"{rate / limit:.0%} of the in-process limit (target ≥ 90%), {versus} "
                        "(target ≥ 1.5×)"
                    )
    print(report(args, device, most, rows, verdicts, timings, done=True))


def load_prefix(where: str, workers: int) -> list[str]:
    """The command before the load generator's: nothing for `all`; for `away`, a `taskset`
    keeping it off the cores `corral-pinned` gives its `workers` and their SMT siblings."""
    import bench

    if where == "all":
        return []
    pinned = set().union(*(bench.siblings(core) for core in bench.last_cores(workers)))
    away = sorted(set(os.sched_getaffinity(0)) - pinned)
    if not away:
        raise SystemExit(f"--load-cpus away: no core is left beside {workers} pinned worker(s)")
    return ["taskset", "-c", ",".join(map(str, away))]


def last_gaps(log: Path) -> str:
    """The last of bench/gpu_worker.py's BENCH_GAPS lines in a server's log (any worker's)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if "gaps:" in line]
    return lines[-1].split("gaps:", 1)[1].strip() if lines else "(no timings logged)"


def report(
    args,
    device: str,
    most: int,
    rows: list[str],
    verdicts: list[str],
    timings: list[str],
    done: bool,
) -> str:
    """Write the "GPU" section as it stands (after every point, so that a run cut short still
    leaves what it measured, marked unfinished); returns it."""
    import bench

    section = "\n\n".join(
        [
            "## GPU",
            f"Command: `{bench.recorded_command('bench-gpu')}` — "
            f"{time.strftime('%Y-%m-%d')}, {device}, "
            f"{os.cpu_count()} cores; ResNet-50 (torchvision, random weights, fp16), the same "
            "number of worker processes on the one GPU for each server, closed loop, "
            f"{args.seconds:g} s per point"
            + (f" (the limit and {most} clients: medians of {args.repeats})" * (args.repeats > 1))
            + (
                "; the load generator off the pinned workers' cores and their SMT siblings"
                * (args.load_cpus == "away")
            )
            + ("." if done else ". **Unfinished: the run stopped after the last row.**"),
            "\n".join(rows),
            "\n".join(f"- {v}" for v in verdicts),
            "Timings (median / mean / p99; Corral's workers from bench/gpu_worker.py, "
            "`BENCH_GAPS=1`):",
            "\n".join(f"- {t}" for t in timings),
        ]
    )
    bench.replace_section(Path(args.out), section)
    return section


if __name__ == "__main__":
    main()
