"""Sentence embeddings (all-MiniLM-L6-v2, examples/embeddings/) through Corral, next to the
model's own in-process throughput and MOSEC serving the same model, in one run.

- in-process: the example's `embed` called directly in this process, batch 1 and batch 32: the
  limit any server can reach (sentences/s) and the model's own batch-1 latency, measured at every
  load point and repeat in turn with the servers (this machine drifts by ±15% over minutes);
- Corral and MOSEC, each with one worker (one torch thread, EMBEDDINGS_THREADS), max batch 1 and
  max batch 32, max wait 10 ms, at 1, 8 and 32 concurrent clients (oha, closed loop).

Targets: Corral (max batch 32) at 32 clients ≥ 90% of the in-process batch-32 throughput and
≥ MOSEC's; Corral at 1 client within 2 ms of the model's own batch-1 latency.

Run with `make bench-embeddings` (opt-in: installs torch into examples/embeddings/.venv). The
report replaces BENCHMARKS.md's "Embeddings" section.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench  # bench/ is on sys.path: this file runs as a script
from bench import HERE, ROOT, System

sys.path.insert(0, str(ROOT / "examples" / "embeddings"))
import worker as embeddings  # the example's model code

SENTENCE = "Corral gathers single requests into batches so that the model runs them together."
BODY = json.dumps({"text": SENTENCE})


class InProcess:
    """The example's `embed` called directly in this process: the limit (sentences/s at batch 1
    and 32) and the model's own batch-1 latency. Measured in turn with the servers, at every
    repeat, so that this noisy machine's drifts hit the limit and the servers alike."""

    def __init__(self) -> None:
        self.model = embeddings.load_model()
        self.samples: dict[int, list[tuple[float, float]]] = {1: [], 32: []}

    def measure(self, seconds: float) -> None:
        for batch in (1, 32):
            texts = [SENTENCE] * batch
            embeddings.embed(self.model, texts)  # warm-up
            calls = []
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                t = time.perf_counter()
                embeddings.embed(self.model, texts)
                calls.append(time.perf_counter() - t)
            rate = batch * len(calls) / (time.perf_counter() - start)
            latency = statistics.median(calls) * 1000
            self.samples[batch].append((rate, latency))
            print(f"in-process b={batch:<2}  {rate:8.1f} sentences/s  call {latency:7.2f} ms",
                  flush=True)  # fmt: skip

    def median(self, batch: int) -> tuple[float, float]:
        rates, latencies = zip(*self.samples[batch])
        return statistics.median(rates), statistics.median(latencies)


def main() -> None:
    parser = bench.options(__doc__, connections="1,8,32", seconds=5.0)
    args = parser.parse_args()

    threads = os.environ.setdefault("EMBEDDINGS_THREADS", "1")
    model = InProcess()
    python = sys.executable
    worker = str(ROOT / "examples" / "embeddings" / "worker.py")

    def corral(batch: int, port: int) -> System:
        command = [
            args.corral, "--listen", f"127.0.0.1:{port}", "--socket", f"{port}.sock",
            "--workers", "1", "--max-batch-size", str(batch), "--max-wait-ms", "10",
            "--timeout-ms", "30000", "--", python, worker,
        ]  # fmt: skip
        return System(f"Corral b={batch}", command, f"http://127.0.0.1:{port}/infer", ("corral",))

    def mosec(batch: int, port: int) -> System:
        command = [
            python, str(HERE / "mosec_embeddings.py"), "--port", str(port),
            "--address", "127.0.0.1", "--timeout", "30000", "--log-level", "warning",
        ]  # fmt: skip
        url = f"http://127.0.0.1:{port}/inference"
        return System(f"MOSEC b={batch}", command, url, ("mosec",), {"BENCH_MAX_BATCH": str(batch)})

    systems = [corral(1, 18400), corral(32, 18401), mosec(1, 18402), mosec(32, 18403)]
    workdir = Path(tempfile.mkdtemp(prefix="corral-embeddings-"))
    for system in systems:
        bench.start(system, "embeddings", workdir, BODY)
    try:
        # The limit is measured in turn with the servers, once per load point and repeat.
        rows = bench.rotate(args, systems, "embeddings", BODY, lambda: model.measure(args.seconds))
    finally:
        for system in systems:
            bench.stop(system)

    limits = {batch: model.median(batch) for batch in (1, 32)}
    limit32, latency1 = limits[32][0], limits[1][1]
    lines = [
        "| clients | system | sentences/s | % of in-process b=32 | p50 ms | p99 ms | errors |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        f"| — | in-process b=1 | {limits[1][0]:.1f} | {limits[1][0] / limit32:.0%} | "
        f"{latency1:.2f} | — | — |",
        f"| — | in-process b=32 | {limit32:.1f} | 100% | {limits[32][1]:.2f} | — | — |",
    ]
    for (name, connections), row in rows.items():
        rps = row.median("rps")
        lines.append(
            f"| {connections} | {name} | {rps:.1f} | {rps / limit32:.0%} | "
            f"{row.median('p50_ms'):.2f} | {row.median('p99_ms'):.2f} | "
            f"{sum(s.errors for s in row.samples)} |"
        )
    top = max(int(c) for c in args.connections.split(","))
    corral32 = rows[("Corral b=32", top)].median("rps")
    mosec32 = rows[("MOSEC b=32", top)].median("rps")
    corral1 = rows.get(("Corral b=1", 1))
    gap = corral1.median("p50_ms") - latency1 if corral1 else float("nan")
    verdict = [
        f"- Corral b=32 at {top} clients: {corral32 / limit32:.0%} of the in-process batch-32 "
        f"throughput (target ≥ 90%), {corral32 / mosec32:.2f}× MOSEC b=32 (target ≥ 1×).",
        f"- Corral b=1 at 1 client: p50 {gap:+.2f} ms against the model's own batch-1 call "
        "(target within 2 ms).",
    ]
    command = bench.recorded_command("bench-embeddings")
    report = "\n\n".join(
        [
            "## Embeddings",
            f"Command: `{command}` — {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
            f"all-MiniLM-L6-v2 on CPU with {threads} torch thread per worker, one worker per "
            f"server, medians of {args.repeats} runs of {args.seconds:g} s (oha closed loop, "
            "one sentence per request).",
            "\n".join(verdict),
            "\n".join(lines),
        ]
    )
    bench.replace_section(Path(args.out), report)
    print(report)


if __name__ == "__main__":
    main()
