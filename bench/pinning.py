"""A pinned worker beside the proxy: the digits model (`make run`'s) with its one worker pinned to
the last core (`--cpus`), under closed-loop load, with this build of Corral and, beside it, an
earlier binary (`--corral-before BIN`, e.g. one from before the proxy kept off pinned cores).

It measures what pinning costs or buys where cores are few: since the proxy keeps its own threads
off a pinned worker's core, on a 2-core machine the proxy has one core left, where before it
could use both. The two binaries run alternately, `--runs` times each, and for each the run of
median req/s is reported, its latencies with it. Run: `make bench-pinning
BENCH_ARGS='--corral-before BIN'` (without it, this build alone). The results replace the
"Pinned worker beside the proxy" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (bench/ on the path first)

WORKER = ROOT / "examples" / "digits" / "worker.py"
SAMPLE = (ROOT / "examples" / "digits" / "sample.json").read_text()
URL = "http://127.0.0.1:18610/infer"


def system(name: str, binary: str, core: int, python: str) -> bench.System:
    command = [
        binary, "--listen", "127.0.0.1:18610", "--socket", "pinning.sock", "--cpus", str(core),
        "--", python, str(WORKER),
    ]  # fmt: skip
    return bench.System(name, command, URL, ("corral",))


def run_once(args, found: bench.System, workdir: Path) -> bench.Sample:
    bench.start(found, "pinning", workdir, body=SAMPLE)
    try:
        return bench.measure(args, found, args.clients, None, body=SAMPLE)
    finally:
        bench.stop(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oha", default=str(HERE / ".tools" / "bin" / "oha"))
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--corral-before", help="an earlier corral binary, measured beside")
    # The project's venv has the digits model's scikit-learn (`make run` serves it from there).
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--runs", type=int, default=3, help="runs of each binary (medians kept)")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()
    core = bench.last_cores(1)[0]
    # Absolute: the servers run in a folder of their own.
    binaries = {"this build": str(Path(args.corral).resolve())}
    if args.corral_before:
        binaries["before"] = str(Path(args.corral_before).resolve())
    workdir = Path(tempfile.mkdtemp(prefix="corral-pinning-"))
    samples: dict[str, list[bench.Sample]] = {name: [] for name in binaries}
    for _ in range(args.runs):  # alternately, so that a noisy minute hits both
        for name, binary in binaries.items():
            measured = system(name.replace(" ", "-"), binary, core, args.python)
            sample = run_once(args, measured, workdir)
            samples[name].append(sample)
            print(f"{name}: {sample.rps:,.0f} req/s, p50 {sample.p50_ms:.2f} ms", flush=True)
    rows = [
        "| binary | req/s | p50 ms | p99 ms | errors |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, found in samples.items():
        # The run of median req/s, its latencies with it (as bench/gpu.py reports a point).
        rate = bench.lower_median([s.rps for s in found])
        median = next(s for s in found if s.rps == rate)
        rows.append(
            f"| {name} | {rate:,.0f} | {median.p50_ms:.2f} | {median.p99_ms:.2f}"
            f" | {sum(s.errors for s in found)} |"
        )
    section = "\n\n".join(
        [
            "## Pinned worker beside the proxy",
            f"Command: `{bench.recorded_command('bench-pinning')}` — {time.strftime('%Y-%m-%d')}, "
            f"{os.cpu_count()} cores; the digits model, one worker pinned to core {core}, "
            f"{args.clients} closed-loop clients, {args.seconds:g} s per run; of {args.runs} "
            "run(s) of each binary, taken alternately, the one of median req/s.",
            "\n".join(rows),
        ]
    )
    bench.replace_section(Path(args.out), section)
    print(section)


if __name__ == "__main__":
    main()
