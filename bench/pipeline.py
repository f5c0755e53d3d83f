"""A two-stage pipeline against the same work done in one stage, side by side in one run.

The work per request: 1 ms of CPU preparing the item (per item, no gain from batching), then a
model on an accelerator that takes 2 ms + 0.2 ms per item of a batch (waiting, not computing).

- `pipeline`: stage `prepare` (2 workers, one per core) feeds stage `model` (1 worker, batches
  of up to 32): preparation runs on both cores while the model works on the previous batch.
- `one stage`: one worker does both, batch by batch (the model needs its accelerator, so one
  worker): its batches take 1 ms per item of CPU plus the model's time.
- `one stage ×2`: the same with two workers — two copies of the model, which a real accelerator
  may not have memory for; shown for completeness.

Limits on this machine (2 cores): preparation caps the pipeline at 2 cores / 1 ms = 2,000 req/s
(less the proxy's own CPU); the one-stage worker at 32 / (32 × 1 ms + 8.4 ms) = 792 req/s.

Run with `make bench-pipeline`. Medians of --repeats runs, servers alternating; the report
replaces BENCHMARKS.md's "Pipeline" section.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import bench  # bench/ is on sys.path: this file runs as a script
from bench import HERE, System

WORKER = str(HERE / "pipeline_worker.py")
LIMITS = {"pipeline": 2 / 0.001, "one stage": 32 / (32 * 0.001 + 0.0084)}


def pipeline_config(python: str, path: Path) -> Path:
    path.write_text(
        f"""
max_wait_ms = 10
timeout_ms = 10000
queue_capacity = 1024

[stages.prepare]
command = ["{python}", "{WORKER}", "prepare"]
workers = 2
max_batch_size = 8

[stages.model]
command = ["{python}", "{WORKER}", "model"]
workers = 1
max_batch_size = 32

[pipelines.main]
stages = ["prepare", "model"]
"""
    )
    return path


def main() -> None:
    parser = bench.options(__doc__, connections="8,64", seconds=5.0)
    args = parser.parse_args()

    python = sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="corral-pipeline-"))
    config = pipeline_config(python, workdir / "pipeline.toml")

    def one_stage(name: str, port: int, workers: int) -> System:
        command = [
            args.corral, "--listen", f"127.0.0.1:{port}", "--socket", f"{port}.sock",
            "--workers", str(workers), "--max-batch-size", "32", "--max-wait-ms", "10",
            "--queue-capacity", "1024", "--timeout-ms", "10000",
            "--", python, WORKER, "both",
        ]  # fmt: skip
        return System(name, command, f"http://127.0.0.1:{port}/infer", ("corral",))

    systems = [
        System(
            "pipeline",
            [args.corral, "--listen", "127.0.0.1:18300", "--socket", "18300.sock",
             "--config", str(config)],
            "http://127.0.0.1:18300/infer",
            ("corral",),
        ),
        one_stage("one stage", 18301, 1),
        one_stage("one stage ×2", 18302, 2),
    ]  # fmt: skip
    for system in systems:
        bench.start(system, "pipeline", workdir)
    try:
        rows = bench.rotate(args, systems, "pipeline")
    finally:
        for system in systems:
            bench.stop(system)

    lines = [
        "| clients | system | req/s | × one stage | % of its limit | p50 ms | p99 ms | errors |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (name, connections), row in rows.items():
        base = rows[("one stage", connections)].median("rps")
        limit = LIMITS.get(name)
        share = f"{row.median('rps') / limit:.0%}" if limit else "—"
        errors = sum(s.errors for s in row.samples)
        lines.append(
            f"| {connections} | {name} | {row.median('rps'):,.0f} | "
            f"{row.median('rps') / base:.2f}× | {share} | {row.median('p50_ms'):.1f} | "
            f"{row.median('p99_ms'):.1f} | {errors} |"
        )
    command = bench.recorded_command("bench-pipeline")
    report = "\n\n".join(
        [
            "## Pipeline",
            f"Command: `{command}` — {time.strftime('%Y-%m-%d')}, medians of {args.repeats} "
            f"runs of {args.seconds:g} s after {args.warmup:g} s warm-up (oha, closed loop). "
            "Per request: 1 ms of CPU preparation, then a batched model of 2 ms + 0.2 ms per "
            "item spent waiting on an accelerator. Limits here: the pipeline "
            f"{LIMITS['pipeline']:,.0f} req/s (preparation on 2 cores), one stage "
            f"{LIMITS['one stage']:,.0f} req/s (one worker doing both).",
            "\n".join(lines),
        ]
    )
    bench.replace_section(Path(args.out), report)
    print(report)


if __name__ == "__main__":
    main()
