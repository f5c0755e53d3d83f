"""Overload without collapse: Corral against MOSEC in one run, with oha recording every answer
(its sqlite output) so that latencies can be split by status.

1. The load-shedding seed's experiment: a 500 ms CPU-bound model, one worker, batch size 1;
   closed-loop clients with a 2 s timeout (sent to Corral as x-corral-timeout-ms), at 4, 8 and
   16 clients. Capacity is 2 req/s.
2. 3x overload, open loop: the cost_sleep model (batch 32, ceiling ~3,810 req/s) offered three
   times its saturated throughput, client timeout 1 s. Goodput = 200s within 1 s per second.
3. Recovery: right after the overload stops, how long until a fresh request gets a 200.

Run with `make bench-overload` (BENCH_ARGS passes options). Results replace the "Overload"
section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import bench  # bench/ is on sys.path: this file runs as a script
import workloads

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BODY = bench.BODY
OPEN_LOOP_CONNECTIONS = 8192


def systems(args, workload: str, max_batch: int, timeout_ms: int) -> list[bench.System]:
    python = sys.executable
    corral = [
        args.corral, "--listen", "127.0.0.1:18110", "--socket", "overload.sock",
        "--workers", "1", "--max-batch-size", str(max_batch), "--max-wait-ms", "10",
        "--timeout-ms", str(timeout_ms), "--", python, str(HERE / "corral_worker.py"),
    ]  # fmt: skip
    mosec = [
        python, str(HERE / "mosec_server.py"), "--port", "18210", "--address", "127.0.0.1",
        "--timeout", str(timeout_ms), "--log-level", "warning",
    ]  # fmt: skip
    env = {"BENCH_WORKLOAD": workload, "BENCH_MAX_BATCH": str(max_batch)}
    return [
        bench.System("corral", corral, "http://127.0.0.1:18110/infer", ("corral",), env=env),
        bench.System("mosec", mosec, "http://127.0.0.1:18210/inference", ("mosec",), env=env),
    ]


def run_oha(args, url: str, seconds: float, connections: int, timeout_s: float,
            rate: int | None, db: Path) -> dict:  # fmt: skip
    command = [
        args.oha, "--no-tui", "--output-format", "json", "-z", f"{seconds}s",
        "-c", str(connections), "-m", "POST", "-T", "application/json", "-d", BODY,
        "-H", f"x-corral-timeout-ms: {int(timeout_s * 1000)}", "-t", f"{timeout_s}s",
        "--db-url", str(db), url,
    ]  # fmt: skip
    if rate:
        command += ["-q", str(rate)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def answers(db: Path) -> dict[int, list[float]]:
    """Durations (seconds) of the answers oha recorded, by status."""
    by_status: dict[int, list[float]] = {}
    with sqlite3.connect(db) as conn:
        for status, duration in conn.execute("SELECT status, duration FROM oha"):
            by_status.setdefault(status, []).append(duration)
    return by_status


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] * 1000


def timeouts(report: dict) -> int:
    return sum(
        int(v) for k, v in report.get("errorDistribution", {}).items() if "timeout" in k.lower()
    )


def seed_experiment(args, workdir: Path) -> list[str]:
    rows = [
        "| clients | system | 2xx | 503 | client timeouts | other | 2xx p50 ms | 2xx p99 ms"
        " | 2xx max ms | 2xx vs capacity |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    capacity = 2 * args.seed_seconds
    for clients in args.seed_clients:
        for system in systems(args, "slow", 1, 2000):
            bench.start(system, "slow", workdir)  # its readiness probe is one warm-up request
            try:
                db = workdir / f"seed-{system.name}-{clients}.db"
                report = run_oha(args, system.url, args.seed_seconds, clients, 2.0, None, db)
            finally:
                bench.stop(system)
            got = answers(db)
            ok = got.get(200, [])
            shed = len(got.get(503, []))
            other = sum(len(v) for k, v in got.items() if k not in (200, 503))
            rows.append(
                f"| {clients} | {system.name} | {len(ok)} | {shed} | {timeouts(report)}"
                f" | {other} | {pct(ok, 50):.0f} | {pct(ok, 99):.0f}"
                f" | {max(ok, default=0) * 1000:.0f} | {len(ok) / capacity:.0%} |"
            )
            print(rows[-1], flush=True)
    return rows


def probe_until_ok(url: str, limit_s: float = 10) -> float:
    """Seconds from now until a request gets a 200 (requests sent back to back)."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        request = urllib.request.Request(
            url,
            data=BODY.encode(),
            headers={"content-type": "application/json", "x-corral-timeout-ms": "1000"},
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
    return float("inf")


def overload(args, workdir: Path) -> list[str]:
    rows = [
        "| system | offered req/s | goodput req/s | goodput vs saturated | 2xx p99 ms"
        " | 503 | 503 p99 ms | other answers | client timeouts | proxy peak RSS MB"
        " | first 200 after ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for system in systems(args, "cost_sleep", 32, 1000):
        bench.start(system, "cost_sleep", workdir)
        try:
            # Saturated throughput of this very server, closed loop, as the reference.
            saturated = bench.oha(args.oha, system.url, 5, 256, None)
            codes = saturated.get("statusCodeDistribution", {})
            saturated_rps = int(codes.get("200", 0)) / 5
            rate = int(3 * saturated_rps)
            db = workdir / f"overload-{system.name}.db"
            # Enough connections that the offered rate holds while answers take up to the 1 s
            # timeout: an open loop, not a closed one capped by the connection count.
            connections = min(rate, OPEN_LOOP_CONNECTIONS)
            report = run_oha(args, system.url, args.overload_seconds, connections, 1.0, rate, db)
            recovery = probe_until_ok(system.url)
            rss = 0.0
            for pid in bench.process_tree(system.proc.pid):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                if stat[stat.index("(") + 1 : stat.rindex(")")] in system.proxy_names:
                    rss += int(status.split("VmHWM:")[1].split()[0]) / 1024
        finally:
            bench.stop(system)
        got = answers(db)
        ok = [d for d in got.get(200, []) if d <= 1.0]
        shed = got.get(503, [])
        goodput = len(ok) / args.overload_seconds
        late = len(got.get(200, [])) - len(ok)
        other = {k: len(v) for k, v in got.items() if k not in (200, 503)}
        if late:
            other["200 after 1 s"] = late
        others = ", ".join(f"{k}: {n}" for k, n in sorted(other.items(), key=str)) or "—"
        rows.append(
            f"| {system.name} | {rate:,} | {goodput:,.0f} | {goodput / saturated_rps:.0%}"
            f" | {pct(ok, 99):.0f} | {len(shed)} | {pct(shed, 99):.2f} | {others}"
            f" | {timeouts(report)}"
            f" | {rss:.0f} | {recovery * 1000:.1f} |"
        )
        print(rows[-1], flush=True)
    return rows


def raise_fd_limit() -> None:
    """Thousands of open connections need thousands of file descriptors (oha and the servers
    inherit this limit)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 4 * OPEN_LOOP_CONNECTIONS)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oha", default=str(HERE / ".tools" / "bin" / "oha"))
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--seed-clients", type=lambda s: [int(c) for c in s.split(",")],
                        default=[4, 8, 16])  # fmt: skip
    parser.add_argument("--seed-seconds", type=float, default=30)
    parser.add_argument("--overload-seconds", type=float, default=15)
    parser.add_argument("--parts", default="seed,overload")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()

    raise_fd_limit()
    workdir = Path(tempfile.mkdtemp(prefix="corral-overload-"))
    seed = seed_experiment(args, workdir) if "seed" in args.parts else ["(not run)"]
    heavy = overload(args, workdir) if "overload" in args.parts else ["(not run)"]
    command = bench.recorded_command("bench-overload")
    section = "\n\n".join(
        [
            "## Overload",
            f"Command: `{command}` — {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; oha "
            "records every answer, so latencies are split by status.",
            f"### The seed's experiment: 500 ms model, batch 1, client timeout 2 s, "
            f"{args.seed_seconds:g} s (capacity {2 * args.seed_seconds:g} answers)",
            "\n".join(seed),
            f"### 3x overload, open loop: cost_sleep (ceiling "
            f"{workloads.CEILING_RPS:,.0f} req/s), client timeout 1 s, {args.overload_seconds:g} s",
            "Saturated throughput is each server's own, measured just before (closed loop, 256 "
            "connections); goodput counts 200s answered within 1 s.",
            "\n".join(heavy),
        ]
    )
    bench.replace_section(Path(args.out), section)
    print(section)


if __name__ == "__main__":
    main()
