"""The worker package's own cost of one batch: what a Python worker spends between two `forward`
calls, without a socket, a proxy or a model.

A batch frame of N small jobs (the GPU run's `{"seed": 1}`, as msgpack; with `--payload tensor`, a
v2 row instead, `{"IN": <tensor value FP32 [3]>}`, as tritonclient's rows reach a worker) is
decoded as the reader thread decodes it (timed on its own), and the decoded batch answered as the
serve loop answers it (timed on its own): each payload decoded and preprocessed, a `forward` that
returns one integer per item (as the GPU run's model does), each output postprocessed and encoded,
and the results frame encoded. The serve loop's part is what the GPU waits through between two
batches in the GPU run ("between batches" in bench/gpu_worker.py's timings) less the socket, the
hand-over from the reader thread and any wait for the proxy's next batch; the reader's part runs
while `forward` does.

Each package runs in a process of its own, alternately, several times; the medians are reported.
With `--package-before DIR`, an earlier `corral` package (DIR holds it, e.g. OLD/python-client/src)
is measured beside the current one. Run: `make bench-worker-batch` (BENCH_ARGS as below). The
results replace the "Worker package: one batch" section of BENCHMARKS.md ("… of v2 rows" with
`--payload tensor`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CURRENT = ROOT / "python-client" / "src"


def child(sizes: list[int], batches: int, payload: str) -> dict[str, dict[str, float]]:
    """In the measured package's own process: per size, the median microseconds of the serve
    loop's part and of the reader's part of one batch."""
    import corral

    class Model(corral.Worker):
        def forward(self, batch: list) -> list:
            return [7] * len(batch)

    found: dict = {str(size): one_size(Model(), size, batches, payload) for size in sizes}
    found["package"] = corral.__file__  # which package this was: see measure
    return found


def one_size(worker, size: int, batches: int, payload: str) -> dict[str, float]:
    import msgpack

    from corral import _protocol as protocol

    if payload == "tensor":  # ext type 1: [datatype, shape, bin] (PROTOCOL.md, "Tensors")
        row = msgpack.packb(["FP32", [3], b"\x00\x00\x80\x3f" * 3])
        one = msgpack.packb({"IN": msgpack.ExtType(1, row)})
    else:
        one = msgpack.packb({"seed": 1})
    jobs = [{"id": os.urandom(16), "payload": one, "timeout_ms": 30000} for _ in range(size)]
    body = protocol.encode_frame({"type": "batch", "jobs": jobs})[4:]
    read = protocol.decode_body(body)["jobs"]  # answering leaves the jobs as they are
    # As the serve loop calls it: `_corral_process`, or in packages from before, `process` or
    # `_corral_answer` (a plain worker is given no link).
    process = (
        getattr(worker, "_corral_process", None)
        or getattr(worker, "process", None)
        or (lambda jobs: worker._corral_answer(jobs, None))
    )
    return {
        # The results frame's body, as the serve loop makes it (packages from before: the frame).
        "serve": median_us(lambda: results_body(protocol)(process(read)), batches),
        "read": median_us(lambda: protocol.decode_body(body), batches),
    }


def results_body(protocol):
    """The serve loop's encoding of a results frame: its body (the prefix goes out apart), or
    in packages from before, the whole frame."""
    return getattr(protocol, "results_body", None) or protocol.encode_results


def median_us(step, batches: int) -> float:
    for _ in range(max(20, batches // 10)):  # warm-up
        step()
    times = []
    for _ in range(batches):
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def measure(
    package: Path, sizes: list[int], batches: int, payload: str
) -> dict[str, dict[str, float]]:
    import bench

    env = {**os.environ, **bench.package_env(str(package))}
    command = [sys.executable, __file__, "--child", "--sizes", ",".join(map(str, sizes))]
    command += ["--batches", str(batches), "--payload", payload]
    # Only stdout is taken: a child that fails shows its traceback.
    out = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    found = json.loads(out)
    imported = Path(found.pop("package")).resolve()
    if not imported.is_relative_to(package.resolve()):
        # A mistyped folder would measure whatever corral is installed, as "before".
        raise SystemExit(f"{package} does not hold the corral package (imported {imported})")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,32,128", help="jobs per batch (a list)")
    parser.add_argument("--batches", type=int, default=2000, help="timed batches per run")
    parser.add_argument("--runs", type=int, default=5, help="runs of each package (medians kept)")
    parser.add_argument(
        "--payload",
        choices=("seed", "tensor"),
        default="seed",
        help="each job's payload: the GPU run's {seed: 1}, or a v2 row of one FP32 [3] tensor",
    )
    parser.add_argument("--package-before", help="a folder holding an earlier corral package")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        print(json.dumps(child(sizes, args.batches, args.payload)))
        return

    import bench

    packages = {"current": CURRENT}
    if args.package_before:
        packages["before"] = Path(args.package_before)
    runs: dict[str, list] = {name: [] for name in packages}
    for _ in range(args.runs):  # alternately, so that a noisy minute hits both
        for name, folder in packages.items():
            runs[name].append(measure(folder, sizes, args.batches, args.payload))
    rows = [
        "| jobs in the batch | package | serve loop µs | per job µs | reader µs |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    for size in sizes:
        for name in packages:
            serve = bench.lower_median([run[str(size)]["serve"] for run in runs[name]])
            read = bench.lower_median([run[str(size)]["read"] for run in runs[name]])
            rows.append(f"| {size} | {name} | {serve:.1f} | {serve / size:.2f} | {read:.1f} |")
    section = "\n\n".join(
        [
            "## Worker package: one batch" + (" of v2 rows" if args.payload == "tensor" else ""),
            f"Command: `{bench.recorded_command('bench-worker-batch')}` — "
            f"{time.strftime('%Y-%m-%d')}, "
            f"{os.cpu_count()} cores; medians of {args.runs} runs of {args.batches} batches each, "
            "the packages alternately. Serve loop: each job decoded, preprocessed, its output "
            "postprocessed and encoded, and the results frame encoded (what the GPU waits "
            "through between two batches, less the socket); reader: the batch frame decoded "
            "(on the reader thread, while `forward` runs).",
            "\n".join(rows),
        ]
    )
    bench.replace_section(Path(args.out), section)
    print(section)


if __name__ == "__main__":
    main()
