"""Where one GPU worker's time goes: the launch-bound setting of the GPU run (one worker, max
batch 32, 256 clients) behind Corral in several variants side by side, against the model's own
loop in process, in one run.

bench/gpu.py measures the targets; this script explains the gap to the in-process limit with one
worker process. Each variant changes one thing:

- `default`: as bench/gpu.py runs it;
- `no prefetch`: `--worker-prefetch false` (no batch arrives while `forward` runs, so the worker's
  reader thread never wants the GIL then; the round trip between batches is paid instead);
- `one core`: the worker pinned to a single core (`taskset`): its two threads hand the GIL over
  on one core instead of waking each other across cores;
- `pinned`: the worker pinned by Corral (`--cpus`), which also keeps the proxy's own threads off
  that core (`one core` leaves them free to run there);
- `core to itself`: as `pinned`, and the load generator kept off that core and its SMT siblings
  too (`taskset`), as when the clients are on other machines (the proxy keeps off the core, not
  its sibling);
- `proxy on 2 threads`: the proxy's runtime with 2 threads instead of one per core
  (`TOKIO_WORKER_THREADS=2`): fewer threads waking on the cores the worker shares;
- `gc frozen` / `gc off`: the worker's objects from loading frozen out of Python's garbage
  collector (`gc.freeze()`), or no collection while serving (`gc.disable()`), by
  bench/gpu_worker.py;
- `package before` (with `--package-before DIR`): the `corral` package installed in DIR (an
  earlier version) instead of the current one.

`--variants` runs only those named (a comma list: `--variants "default,one core"`). For each:
items/s at 256 clients and ÷ the in-process limit, p50/p99, and the worker's own
timings (bench/gpu_worker.py's BENCH_GAPS lines: `forward`, the gap between batches, the mean
batch size, the garbage collector's time per batch). The in-process loop reports its time per
batch the same way. Run: `make bench-gpu-probe` (needs torch with CUDA and a GPU, as
bench/gpu.py; exits 2 without). The results replace the "GPU: one worker at max batch N, where
the time goes" section of BENCHMARKS.md (N: `--max-batch`, 32 by default).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gpu  # noqa: E402  (bench/ on the path first)

WARMUP_S = 2


class Variant(NamedTuple):
    name: str
    options: list[str]  # extra corral options
    prefix: list[str]  # before the worker command
    env: dict[str, str]  # extra environment (the proxy's and, through it, the worker's)
    clients: tuple[str, ...] = ()  # before the load generator's command


def variants(args) -> list[Variant]:
    import bench

    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[-1]
    # The load generator off the worker's core and its SMT siblings (the same physical core);
    # where nothing else is left, `core to itself` cannot be measured and is left out.
    away = sorted(set(allowed) - bench.siblings(core))
    clients = ("taskset", "-c", ",".join(map(str, away)))
    alone = [Variant("core to itself", ["--cpus", str(core)], [], {}, clients)] if away else []
    found = [
        Variant("default", [], [], {}),
        Variant("no prefetch", ["--worker-prefetch", "false"], [], {}),
        Variant("one core", [], ["taskset", "-c", str(core)], {}),
        Variant("pinned", ["--cpus", str(core)], [], {}),
        *alone,
        Variant("proxy on 2 threads", [], [], {"TOKIO_WORKER_THREADS": "2"}),
        Variant("gc frozen", [], [], {"BENCH_GC": "freeze"}),
        Variant("gc off", [], [], {"BENCH_GC": "off"}),
    ]
    if args.package_before:
        found.append(Variant("package before", [], [], bench.package_env(args.package_before)))
    return found


def main() -> None:
    import bench

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oha", default=str(HERE / ".tools" / "bin" / "oha"))
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--package-before", help="a folder holding an earlier corral package")
    parser.add_argument(
        "--variants", help="the variants to run, by name (a comma list; all of them by default)"
    )
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()
    device = gpu.require_gpu()

    workdir = Path(tempfile.mkdtemp(prefix="corral-gpu-probe-"))
    print(f"logs in {workdir}", flush=True)
    limit, _, times = gpu.in_process(args.max_batch, args.seconds)
    loop = gpu.spread(times)
    rows = [
        "| variant | items/s | ÷ in-process limit | p50 ms | p99 ms | worker's own timings |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
        f"| in process (the limit) | {limit:,.0f} | 1.00 | — | — | a batch {loop} "
        "(median / mean / p99) |",
    ]
    print(rows[-1], flush=True)
    found = variants(args)
    if args.variants:
        wanted = [name.strip() for name in args.variants.split(",")]
        if "package before" in wanted and not args.package_before:
            raise SystemExit("--variants: 'package before' needs --package-before DIR")
        unknown = set(wanted) - {variant.name for variant in found}
        if unknown:
            raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}")
        found = [variant for variant in found if variant.name in wanted]
    for variant in found:
        command = [
            args.corral, "--listen", "127.0.0.1:18600", "--socket", "gpu.sock", "--gpus", "0",
            "--max-batch-size", str(args.max_batch), "--max-wait-ms", "5",
            "--queue-capacity", "4096", "--timeout-ms", "30000", *variant.options,
            "--", *variant.prefix, sys.executable, str(HERE / "gpu_worker.py"),
        ]  # fmt: skip
        system = bench.System(
            variant.name.replace(" ", "-"),
            command,
            "http://127.0.0.1:18600/infer",
            ("corral",),
            env={"BENCH_GAPS": "1", **variant.env},
        )
        bench.start(system, "probe", workdir, body=gpu.BODY)
        try:
            bench.oha(args.oha, system.url, WARMUP_S, args.clients, None, gpu.BODY, variant.clients)
            rate, p50, p99 = gpu.measure(args, system, args.clients, prefix=variant.clients)
        finally:
            bench.stop(system)
        rows.append(
            f"| {variant.name} | {rate:,.0f} | {rate / limit:.2f} | {p50:.1f} | {p99:.1f}"
            f" | {gpu.last_gaps(system.log)} |"
        )
        print(rows[-1], flush=True)
    section = "\n\n".join(
        [
            f"## GPU: one worker at max batch {args.max_batch}, where the time goes",
            f"Command: `{bench.recorded_command('bench-gpu-probe')}` — "
            f"{time.strftime('%Y-%m-%d')}, "
            f"{device}, {os.cpu_count()} cores; the model of the GPU run, max batch "
            f"{args.max_batch}, one worker, {args.clients} closed-loop clients, "
            f"{args.seconds:g} s per variant.",
            "\n".join(rows),
        ]
    )
    bench.replace_section(Path(args.out), section)
    print(section)


if __name__ == "__main__":
    main()
