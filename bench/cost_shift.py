"""Cost shift: a model that becomes five times slower while it serves, and fast again.

One worker, batches of at most 4 costing 200 ms (180 ms + 5 ms an item); an open-loop client
sends 12 requests a second (0.6x what the worker serves) with a 1 s deadline each. After the
first phase the model becomes `--factor` times slower (a batch of 1 to 4 about a second at 5x),
then fast again. Reported per phase: answers by status, and how many of the jobs Corral admitted
ended 408 (admission's promise is that what it admits makes its deadline). The baseline, in the
same run: the slow model served from a fresh start (its cost learned from the first batch), the
most a proxy that knew the new cost could serve. `--corral-before` runs an older binary too.

Run with `make bench-cost-shift` (BENCH_ARGS passes options). Results replace the "Cost shift"
section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

import bench  # bench/ is on sys.path: this file runs as a script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RATE = 12.0
DEADLINE_MS = 1000
PORT = 18190


async def load(
    url: str, phases: list[tuple[str, float]], shift, rate: float
) -> list[tuple[str, int]]:
    """Requests at RATE through the phases (name, seconds); `shift(name)` as each begins.
    Returns (phase, status) per request, -1 for a transport error."""
    answers: list[tuple[str, int]] = []
    headers = {"x-corral-timeout-ms": str(DEADLINE_MS), "content-type": "application/json"}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:

        async def one(phase: str) -> None:
            try:
                answer = await client.post(url, content=b'{"x":1}', headers=headers)
                answers.append((phase, answer.status_code))
            except httpx.HTTPError:
                answers.append((phase, -1))

        tasks = set()
        due = time.monotonic()
        for name, seconds in phases:
            shift(name)
            end = due + seconds
            while due < end:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                task = asyncio.create_task(one(name))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                due += 1 / rate
        await asyncio.gather(*tasks)
    return answers


def system(binary: str, workdir: Path, factor_file: Path, env: dict[str, str]) -> bench.System:
    command = [
        binary, "--listen", f"127.0.0.1:{PORT}", "--socket", str(workdir / "w.sock"),
        "--workers", "1", "--max-batch-size", "4", "--timeout-ms", "5000",
        "--", sys.executable, str(HERE / "shift_worker.py"),
    ]  # fmt: skip
    env = {**env, "SHIFT_FACTOR_FILE": str(factor_file)}
    return bench.System("corral", command, f"http://127.0.0.1:{PORT}/infer", ("corral",), env)


def run(binary, phases, factors: dict[str, float], env: dict[str, str], rate: float):
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        factor_file = workdir / "factor"
        factor_file.write_text("1")
        proxy = system(binary, workdir, factor_file, env)
        bench.start(proxy, "cost-shift", workdir, body='{"x":1}')
        try:

            def shift(name: str) -> None:
                factor_file.write_text(str(factors[name]))

            return asyncio.run(load(f"http://127.0.0.1:{PORT}/infer", phases, shift, rate))
        finally:
            bench.stop(proxy)


def table(system: str, answers: list[tuple[str, int]], phases) -> list[str]:
    rows = []
    for name, seconds in phases:
        counts = Counter(status for phase, status in answers if phase == name)
        admitted = counts[200] + counts[408]
        late = f"{counts[408] / admitted:.0%}" if admitted else "—"
        rows.append(
            f"| {system} | {name} ({seconds:.0f} s) | {sum(counts.values())} | {counts[200]} | "
            f"{counts[200] / seconds:.1f} | {counts[408]} | {counts[503]} | "
            f"{sum(n for s, n in counts.items() if s not in (200, 408, 503))} | {late} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--corral-before", help="an older corral binary, run the same way")
    parser.add_argument("--factor", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=30.0, help="the slow phase's length")
    parser.add_argument("--rate", type=float, default=RATE, help="requests a second")
    parser.add_argument("--base-ms", type=float, default=180.0, help="a batch's own cost")
    parser.add_argument("--per-item-ms", type=float, default=5.0, help="each item's cost")
    args = parser.parse_args()
    cost = {"SHIFT_BASE_MS": str(args.base_ms), "SHIFT_PER_ITEM_MS": str(args.per_item_ms)}
    phases = [("fast", 10.0), ("slow", args.seconds), ("fast again", 15.0)]
    factors = {"fast": 1.0, "slow": args.factor, "fast again": 1.0}
    rows = []
    systems = [("corral", args.corral)]
    if args.corral_before:
        systems.append(("corral-before", args.corral_before))
    for system, binary in systems:
        rows += table(system, run(binary, phases, factors, cost, args.rate), phases)
        print("\n".join(rows[-3:]), flush=True)
    # The baseline: the slow model from a fresh start, its cost known from the first batch.
    slow = {key: str(float(value) * args.factor) for key, value in cost.items()}
    baseline = [("slow, from the start", args.seconds)]
    only = {baseline[0][0]: 1.0}
    rows += table("corral", run(args.corral, baseline, only, slow, args.rate), baseline)
    print(rows[-1], flush=True)
    print()
    date, cores = time.strftime("%Y-%m-%d"), os.cpu_count()
    print(f"Command: `make bench-cost-shift` — {date}, {cores} cores;")
    print(
        f"{args.rate:g} requests/s, {DEADLINE_MS} ms deadline, batches of up to 4 costing "
        f"{args.base_ms:g} ms + {args.per_item_ms:g} ms an item, {args.factor:g}x slower.\n"
    )
    print("| system | phase | sent | 200 | 200/s | 408 | 503 | other | admitted ending 408 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
