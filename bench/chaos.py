"""Chaos: steady load against a server with several workers while workers are killed at random.

For a bounded time, an open-loop client sends requests at a fixed rate, each with a deadline
(x-corral-timeout-ms), while a killer SIGKILLs a random worker process every so often. Reported
per server: requests sent, answers by status, answers later than their deadline + 50 ms, and
requests that never got an answer (none within deadline + 5 s). Goal for Corral: zero never
answered, zero late, successes >= 99% of requests (every deadline here leaves time for a retry).

Run with `make bench-chaos` (BENCH_ARGS passes options). Results replace the "Chaos" section of
BENCHMARKS.md. Corral and MOSEC run in the same harness, one after the other, under the same
kill schedule (same seed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

import bench  # bench/ is on sys.path: this file runs as a script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LATE_SLACK = 0.05
NEVER = 5.0


def systems(args) -> list[bench.System]:
    python = sys.executable
    corral = [
        args.corral, "--listen", "127.0.0.1:18120", "--socket", "chaos.sock",
        "--workers", str(args.workers), "--max-batch-size", "32", "--max-wait-ms", "10",
        "--", python, str(HERE / "corral_worker.py"),
    ]  # fmt: skip
    mosec = [
        python, str(HERE / "mosec_server.py"), "--port", "18220", "--address", "127.0.0.1",
        "--timeout", str(args.deadline_ms), "--log-level", "warning",
    ]  # fmt: skip
    env = {"BENCH_WORKERS": str(args.workers)}
    every = {
        "corral": bench.System(
            "corral", corral, "http://127.0.0.1:18120/infer", ("corral",), env=env
        ),
        "mosec": bench.System(
            "mosec", mosec, "http://127.0.0.1:18220/inference", ("mosec",), env=env
        ),
    }
    return [every[name] for name in args.systems.split(",")]


def worker_pids(system: bench.System) -> list[int]:
    """The model worker processes of a running server (never the proxy or its main process)."""
    pids = []
    for pid in bench.process_tree(system.proc.pid):
        if pid == system.proc.pid:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # Corral spawns the worker script; MOSEC forks its workers through multiprocessing.
        if "corral_worker.py" in cmdline or "multiprocessing.spawn" in cmdline:
            pids.append(pid)
    return pids


async def killer(system: bench.System, stop: asyncio.Event, rng: random.Random, kills: list):
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        pids = worker_pids(system)
        if pids and not stop.is_set():
            victim = rng.choice(sorted(pids))
            try:
                os.kill(victim, signal.SIGKILL)
                kills.append(victim)
            except ProcessLookupError:
                pass


async def one(client: httpx.AsyncClient, url: str, deadline_s: float, results: list) -> None:
    sent = time.monotonic()
    try:
        response = await client.post(
            url,
            content=bench.BODY,
            headers={
                "content-type": "application/json",
                "x-corral-timeout-ms": str(int(deadline_s * 1000)),
            },
            timeout=deadline_s + NEVER,
        )
        results.append((response.status_code, time.monotonic() - sent))
    except httpx.TimeoutException:
        results.append(("never", time.monotonic() - sent))
    except httpx.HTTPError as e:
        results.append((type(e).__name__, time.monotonic() - sent))


async def drive(args, system: bench.System) -> tuple[list, list]:
    results: list = []
    kills: list = []
    stop = asyncio.Event()
    rng = random.Random(args.seed)
    deadline_s = args.deadline_ms / 1000
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as client:
        chaos = asyncio.create_task(killer(system, stop, rng, kills))
        tasks = []
        start = time.monotonic()
        count = int(args.rate * args.seconds)
        for n in range(count):
            # Open loop: request n leaves at start + n / rate, whatever happened to the others.
            # Always yield, even when behind: the answers must be read while requests go out.
            await asyncio.sleep(max(0.0, start + n / args.rate - time.monotonic()))
            tasks.append(asyncio.create_task(one(client, system.url, deadline_s, results)))
        stop.set()
        await asyncio.gather(*tasks)
        chaos.cancel()
    return results, kills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--systems", default="corral,mosec")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200, help="requests per second")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--deadline-ms", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--oha", help="unused; accepted for the Makefile's sake")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="corral-chaos-"))
    rows = [
        "| system | sent | 200 | other answers | never answered | answered after deadline"
        " + 50 ms | workers killed | successes |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for system in systems(args):
        bench.start(system, "cost_sleep", workdir)
        try:
            results, kills = asyncio.run(drive(args, system))
        finally:
            bench.stop(system)
        statuses = Counter(status for status, _ in results)
        late = sum(
            1
            for status, took in results
            if status != "never" and took > args.deadline_ms / 1000 + LATE_SLACK
        )
        others = ", ".join(
            f"{status}: {n}" for status, n in sorted(statuses.items(), key=str) if status != 200
        )
        rows.append(
            f"| {system.name} | {len(results)} | {statuses.get(200, 0)} | {others or '—'}"
            f" | {statuses.get('never', 0)} | {late} | {len(kills)}"
            f" | {statuses.get(200, 0) / max(len(results), 1):.1%} |"
        )
        print(rows[-1], flush=True)

    section = "\n\n".join(
        [
            "## Chaos",
            f"Command: `{bench.recorded_command('bench-chaos')}` — "
            f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores. "
            f"{args.workers} worker processes (cost_sleep model, batch 32), an open loop of "
            f"{args.rate:g} req/s for {args.seconds:g} s, deadline {args.deadline_ms} ms per "
            "request; a random worker process is SIGKILLed every 0.5–1.5 s (same seed for both "
            "servers). 'Never answered': no answer within deadline + 5 s.",
            "\n".join(rows),
        ]
    )
    bench.replace_section(Path(args.out), section)
    print(section)


if __name__ == "__main__":
    main()
