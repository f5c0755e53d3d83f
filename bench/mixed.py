"""Goodput for the traffic that matters: priority classes and weight budgets, measured.

1. Classes. The cost model (2 ms + 0.2 ms per item, batch 32; `cost_sleep` by default, so that on
   a small machine the model does not take the load generator's cores — `--workload cost` burns
   them instead) first runs closed loop to find the saturated throughput S. Then an open loop at
   2 S for `--seconds`: 20% interactive traffic (`x-corral-priority: high`, 300 ms deadline) and
   80% bulk (`low`, 5 s deadline), one oha per class, against Corral with classes (headers sent),
   Corral without them (the same traffic, no priority header: one FIFO) and MOSEC (its timeout
   set to the bulk deadline; every client stops waiting at its own deadline) — in one run.
   Goodput is 200s answered within their class's deadline, per second.
2. Weights. Items whose text is 1–512 characters long (few long, many short: one oha per
   length, at rates falling by √2 as the length doubles) against a worker whose batch costs
   2 ms + 5 µs per character + 20 ms × (characters / 1024)² (a model whose memory traffic grows
   faster than the batch's total length, as attention's does), declaring `weight = "/text"`:
   Corral with `--max-batch-weight 512` against Corral batching by count alone (32), both offered
   the same rates — 0.7× and 1.5× the count-batched closed-loop throughput at the mix's mean
   length — for latency below saturation and throughput above it.

3. Overtaking. A closed loop of `high` clients (256) keeps the one worker busy; beside it, an
   open loop of `normal` requests (20 a second) with a 2 s deadline, shorter than their
   promotion (`--priority-aging-ms`, 5 s): none can be served before its deadline. Counted per
   normal request: refused at once (503) or left to expire (408), against `--corral-before`
   (an earlier build) if given. The normal loop starts 3 s after the flood.

Run with `make bench-mixed` (BENCH_ARGS passes options). The results replace the "Priorities,
tenants and weights" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

import bench  # bench/ is on sys.path: this file runs as a script
import overload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Lengths of the weights scenario, and each one's share of the traffic (falling by √2 as the
# length doubles: mean length 23, and one batch of 32 in three holds a 512).
LENGTHS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
SHARES = [2.0 ** (-i / 2) for i in range(len(LENGTHS))]
BUDGET = 512


def body(length: int) -> str:
    return json.dumps({"text": "x" * length})


def corral_system(
    args, name: str, port: int, worker: str, *extra: str, binary: str | None = None
) -> bench.System:
    command = [
        binary or args.corral, "--listen", f"127.0.0.1:{port}", "--socket", f"{name}.sock",
        "--workers", "1", "--max-batch-size", "32", "--max-wait-ms", "10",
        "--timeout-ms", "5000", *extra, "--", sys.executable, str(HERE / worker),
    ]  # fmt: skip
    return bench.System(name, command, f"http://127.0.0.1:{port}/infer", ("corral",))


def mosec_system(port: int) -> bench.System:
    command = [
        sys.executable, str(HERE / "mosec_server.py"), "--port", str(port),
        "--address", "127.0.0.1", "--timeout", "5000", "--log-level", "warning",
    ]  # fmt: skip
    return bench.System("mosec", command, f"http://127.0.0.1:{port}/inference", ("mosec",))


def oha_run(args, url: str, rate: int, deadline_s: float, db: Path, headers: list[str],
            data: str = bench.BODY) -> dict:  # fmt: skip
    """One open-loop oha at `rate` req/s whose clients give up at `deadline_s`."""
    connections = max(16, min(overload.OPEN_LOOP_CONNECTIONS, int(rate * deadline_s * 1.5)))
    command = [
        args.oha, "--no-tui", "--output-format", "json", "-z", f"{args.seconds}s",
        "-c", str(connections), "-q", str(rate), "-m", "POST", "-T", "application/json",
        "-d", data, "-t", f"{deadline_s}s", "--db-url", str(db), url,
    ]  # fmt: skip
    for header in headers:
        command += ["-H", header]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def together(runs: list) -> list[dict]:
    """Runs the oha calls at once (one thread each) and returns their reports in order."""
    reports: list[dict] = [{} for _ in runs]

    def one(i, call):
        reports[i] = call()

    threads = [threading.Thread(target=one, args=(i, call)) for i, call in enumerate(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return reports


def corral_counters(url: str) -> str:
    """Evictions and sheds by reason and class, from the proxy's own metrics."""
    base = url.rsplit("/", 1)[0]
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return "—"
    counts = []
    for line in text.splitlines():
        if line.startswith(("corral_jobs_evicted_total{", "corral_jobs_shed_total{")):
            name, value = line.rsplit(" ", 1)
            if float(value) > 0:
                short = name.replace("corral_jobs_", "").replace("_total", "")
                short = short.replace('stage="default",', "")
                counts.append(f"{short} {float(value):.0f}")
    return ", ".join(counts) or "none"


def saturation(args, system: bench.System, data: str = bench.BODY) -> float:
    """200s per second, closed loop at 256 connections (5 s)."""
    report = bench.oha(args.oha, system.url, 5, 256, None, body=data)
    return int(report.get("statusCodeDistribution", {}).get("200", 0)) / 5


def classes(args, workdir: Path) -> list[str]:
    env = {"BENCH_WORKLOAD": args.workload, "BENCH_MAX_BATCH": "32"}
    corral = corral_system(args, "corral", 18300, "corral_worker.py")
    corral.env = env
    reference = saturation_of(args, corral, workdir)
    high_rate, low_rate = int(0.2 * 2 * reference), int(0.8 * 2 * reference)
    rows = [
        f"Saturated throughput S (Corral, closed loop): {reference:,.0f} req/s; offered "
        f"{high_rate:,} req/s interactive + {low_rate:,} req/s bulk = 2 S for {args.seconds:g} s.",
        "",
        "| system | class | offered req/s | goodput req/s | goodput ÷ offered | 200 p50 ms"
        " | 200 p99 ms | 200 too late | 503 | client gave up | proxy counters |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    totals = []
    cases = [
        ("corral (classes)", corral_system(args, "classes", 18301, "corral_worker.py"), True),
        ("corral (one FIFO)", corral_system(args, "fifo", 18302, "corral_worker.py"), False),
        ("mosec", mosec_system(18303), False),
    ]
    for label, system, with_classes in cases:
        system.env = env
        bench.start(system, args.workload, workdir)
        try:
            calls = []
            for cls, rate, deadline in (("high", high_rate, 0.3), ("low", low_rate, 5.0)):
                headers = [f"x-corral-timeout-ms: {int(deadline * 1000)}"]
                if with_classes:
                    headers.append(f"x-corral-priority: {cls}")
                db = workdir / f"{system.name}-{cls}.db"
                run = partial(oha_run, args, system.url, rate, deadline, db, headers)
                calls.append((cls, rate, deadline, db, run))
            reports = together([call[-1] for call in calls])
            counters = corral_counters(system.url) if system.name != "mosec" else "—"
        finally:
            bench.stop(system)
        total = 0.0
        for (cls, rate, deadline, db, _), report in zip(calls, reports):
            got = overload.answers(db)
            sent = sum(len(v) for v in got.values()) + overload.timeouts(report)
            ok = [d for d in got.get(200, []) if d <= deadline]
            goodput = len(ok) / args.seconds
            total += goodput
            name = "interactive (high, 300 ms)" if cls == "high" else "bulk (low, 5 s)"
            rows.append(
                f"| {label} | {name} | {sent / args.seconds:,.0f} | {goodput:,.0f}"
                f" | {goodput / max(rate, 1):.1%} | {overload.pct(ok, 50):.1f}"
                f" | {overload.pct(ok, 99):.1f} | {len(got.get(200, [])) - len(ok)}"
                f" | {len(got.get(503, []))}"
                f" | {overload.timeouts(report)} | {counters if cls == 'high' else ''} |"
            )
            print(rows[-1], flush=True)
        totals.append(f"{label}: {total:,.0f} req/s = {total / reference:.0%} of S")
    rows += ["", "Total goodput: " + "; ".join(totals) + "."]
    return rows


def saturation_of(args, system: bench.System, workdir: Path, data: str = bench.BODY) -> float:
    bench.start(system, args.workload, workdir, body=data)
    try:
        return saturation(args, system, data)
    finally:
        bench.stop(system)


def weights(args, workdir: Path) -> list[str]:
    count = corral_system(args, "count", 18310, "weighted_worker.py")
    weight = corral_system(args, "weight", 18311, "weighted_worker.py",
                           "--max-batch-weight", str(BUDGET))  # fmt: skip
    mean = round(sum(n * s for n, s in zip(LENGTHS, SHARES)) / sum(SHARES))
    reference = saturation_of(args, count, workdir, data=body(mean))
    rows = [
        f"Count-batched closed-loop throughput at the mean length ({mean}): {reference:,.0f} "
        "items/s.",
        "",
        "| batching | offered items/s | 200 items/s | 200 p50 ms | 200 p99 ms | 503"
        " | client gave up |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    cases = [
        (label, system, int(load * reference))
        for load in (0.7, 1.5)
        for label, system in (("by count (32)", count), (f"by weight ({BUDGET})", weight))
    ]
    for label, system, rate in cases:
        bench.start(system, "weights", workdir, body=body(1))
        try:
            calls = []
            for length, share in zip(LENGTHS, SHARES):
                r = max(1, int(rate * share / sum(SHARES)))
                db = workdir / f"{system.name}-{length}.db"
                run = partial(oha_run, args, system.url, r, 5.0, db, [], data=body(length))
                calls.append((db, run))
            reports = together([call[-1] for call in calls])
        finally:
            bench.stop(system)
        ok: list[float] = []
        shed = gave_up = sent = 0
        for (db, _), report in zip(calls, reports):
            got = overload.answers(db)
            ok += got.get(200, [])
            shed += len(got.get(503, []))
            gave_up += overload.timeouts(report)
            sent += sum(len(v) for v in got.values()) + overload.timeouts(report)
        rows.append(
            f"| {label} | {sent / args.seconds:,.0f} | {len(ok) / args.seconds:,.0f}"
            f" | {overload.pct(ok, 50):.1f} | {overload.pct(ok, 99):.1f} | {shed} | {gave_up} |"
        )
        print(rows[-1], flush=True)
    return rows


def oha_closed(args, url: str, seconds: float, connections: int, db: Path,
               headers: list[str]) -> dict:  # fmt: skip
    """One closed-loop oha of `connections` clients for `seconds`."""
    command = [
        args.oha, "--no-tui", "--output-format", "json", "-z", f"{seconds}s",
        "-c", str(connections), "-m", "POST", "-T", "application/json", "-d", bench.BODY,
        "-t", "10s", "--db-url", str(db), url,
    ]  # fmt: skip
    for header in headers:
        command += ["-H", header]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


FLOOD_DELAY_S = 3.0


def flood(args, workdir: Path) -> list[str]:
    env = {"BENCH_WORKLOAD": args.workload, "BENCH_MAX_BATCH": "32"}
    builds = [("corral", args.corral)]
    if args.corral_before:
        builds.append(("corral-before", args.corral_before))
    seconds = args.seconds
    rows = [
        f"256 closed-loop `high` clients; `normal` requests at 20 a second, 2 s deadline, for "
        f"{seconds:g} s from {FLOOD_DELAY_S:g} s into the flood; promotion after 5 s.",
        "",
        "| build | high 200 req/s | normal sent | normal 200 | normal 503 | 503 p50 ms"
        " | normal 408 | client gave up | proxy counters |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for port, (label, binary) in enumerate(builds, start=18320):
        system = corral_system(args, label, port, "corral_worker.py", binary=binary)
        system.env = env
        bench.start(system, args.workload, workdir)
        try:
            high_db, normal_db = workdir / f"{label}-high.db", workdir / f"{label}-normal.db"
            high = partial(oha_closed, args, system.url, seconds + FLOOD_DELAY_S, 256, high_db,
                           ["x-corral-priority: high"])  # fmt: skip

            def normal(db=normal_db, url=system.url):
                time.sleep(FLOOD_DELAY_S)
                headers = ["x-corral-priority: normal", "x-corral-timeout-ms: 2000"]
                return oha_run(args, url, 20, 3.0, db, headers)

            _, normal_report = together([high, normal])
            counters = corral_counters(system.url)
        finally:
            bench.stop(system)
        got = overload.answers(normal_db)
        highs = overload.answers(high_db).get(200, [])
        sent = sum(len(v) for v in got.values()) + overload.timeouts(normal_report)
        rows.append(
            f"| {label} | {len(highs) / (seconds + FLOOD_DELAY_S):,.0f} | {sent}"
            f" | {len(got.get(200, []))} | {len(got.get(503, []))}"
            f" | {overload.pct(got.get(503, []), 50):.1f} | {len(got.get(408, []))}"
            f" | {overload.timeouts(normal_report)} | {counters} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oha", default=str(HERE / ".tools" / "bin" / "oha"))
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workload", default="cost_sleep", choices=["cost", "cost_sleep"])
    parser.add_argument("--parts", default="classes,weights,flood")
    parser.add_argument(
        "--corral-before",
        help="another corral binary (an earlier build), beside this one in the flood part",
    )
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()

    overload.raise_fd_limit()
    workdir = Path(tempfile.mkdtemp(prefix="corral-mixed-"))
    first = classes(args, workdir) if "classes" in args.parts else ["(not run)"]
    second = weights(args, workdir) if "weights" in args.parts else ["(not run)"]
    third = flood(args, workdir) if "flood" in args.parts else ["(not run)"]
    command = bench.recorded_command("bench-mixed")
    section = "\n\n".join(
        [
            "## Priorities, tenants and weights",
            f"Command: `{command}` — {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; oha "
            "records every answer; goodput counts 200s within the class's deadline.",
            f"### Interactive and bulk traffic at 2× saturation ({args.workload}, batch 32, "
            "one worker)",
            "\n".join(first),
            f"### Weight budgets: lengths 1–512, a model whose cost grows with the batch's "
            f"total length ({args.seconds:g} s each)",
            "\n".join(second),
            "### Overtaking: `normal` requests beside a flood of `high` ones that keeps them "
            f"past their deadline ({args.workload}, batch 32, one worker)",
            "\n".join(third),
        ]
    )
    bench.replace_section(Path(args.out), section)
    print(section)


if __name__ == "__main__":
    main()
