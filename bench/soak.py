"""Soak: a long run of mixed traffic that checks, at the end, that nothing was lost or leaked.

Requests (bounded in count and time) go to a Corral running the scripted test worker: valid ones
carry a per-request nonce that must come back in their own answer; invalid ones must get 422;
slow ones with a short deadline must get 408; some are cancelled by the client before their
answer. At the end: every request got exactly one outcome, every answer was the right one for
its request, proxy RSS is within a margin of its RSS after warm-up, and the proxy's open file
descriptors are back where they started.

A second phase sends large frames to misbehaving workers: bodies and answers of random sizes up
to 4 MiB each way (so batches of several MiB, sent ahead while the workers are busy), while a
chaos thread SIGKILLs or SIGSTOPs a random worker every 1-3 s (a stopped worker is declared hung
after --batch-timeout-ms and killed by the proxy). Every request must get exactly one outcome,
every 200 must be its own right answer, no request may wait out its deadline (a stuck stage
shows as 408s), and RSS must stay within a margin after warm-up.

Run with `make bench-soak` (BENCH_ARGS passes options, e.g. --requests 200000). Results replace
the "Soak" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import bench  # bench/ is on sys.path: this file runs as a script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTED = ROOT / "tests" / "workers" / "scripted.py"
SIZES = HERE / "soak_worker.py"
RSS_MARGIN = 0.10
# Multi-MiB buffers come and go in the large phase; the allocator keeps some of them.
LARGE_RSS_MARGIN = 0.50
MAX_BLOB = 4 * 1024 * 1024


def proxy_rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def proxy_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Client:
    """One keep-alive connection, as one thread of the load uses it (stdlib http.client: on this
    2-core machine it sustains ~20x the request rate of httpx's async client)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: dict, timeout: float = 30, **headers: str) -> tuple[int, dict]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        self.conn.timeout = timeout
        if self.conn.sock is not None:
            self.conn.sock.settimeout(timeout)
        try:
            self.conn.request(
                "POST",
                "/infer",
                body=json.dumps(body).encode(),
                headers={"content-type": "application/json", **headers},
            )
            response = self.conn.getresponse()
            return response.status, json.loads(response.read())
        except BaseException:
            # A timed-out or broken connection is not reused: the client hangs up (cancels).
            self.conn.close()
            self.conn = None
            raise


def one(client: Client, kind: str, outcomes: Counter, wrong: list, lock: threading.Lock) -> None:
    nonce = uuid.uuid4().hex
    outcome, problem = "", None
    try:
        if kind == "valid":
            status, body = client.post({"nonce": nonce})
            ok = status == 200 and body["echo"] == {"nonce": nonce}
            outcome, problem = ("valid ok", None) if ok else ("valid WRONG", (status, body))
        elif kind == "invalid":
            status, body = client.post({"invalid": nonce})
            ok = status == 422 and body["message"] == nonce
            outcome, problem = ("invalid 422", None) if ok else ("invalid WRONG", (status, body))
        elif kind == "slow":
            status, body = client.post({"sleep_ms": 30}, **{"x-corral-timeout-ms": "10"})
            ok = status in (408, 503)  # expired, or shed because it could not make it
            outcome, problem = (f"slow {status}", None) if ok else ("slow WRONG", (status, body))
        else:  # cancelled: the client hangs up before the worker can answer
            client.post({"sleep_ms": 40}, timeout=0.01)
            outcome = "cancelled but answered"
    except TimeoutError:
        outcome = "cancelled" if kind == "cancelled" else f"{kind} TIMEOUT"
        problem = None if kind == "cancelled" else (kind, "timeout")
    except (OSError, http.client.HTTPException) as e:
        outcome, problem = f"{kind} ERROR", (kind, repr(e))
    with lock:
        outcomes[outcome] += 1
        if problem:
            wrong.append(problem)


def drive(url: str, count: int, concurrency: int, seconds: float, seed: int):
    rng = random.Random(seed)
    # Slow and cancelled jobs hold their whole batch (the scripted worker sleeps per batch), so
    # they are kept rare enough that the run measures the proxy, not the sleeps.
    kinds = rng.choices(["valid", "invalid", "slow", "cancelled"], [96, 3, 0.5, 0.5], k=count)
    outcomes: Counter = Counter()
    wrong: list = []
    lock = threading.Lock()
    work = iter(kinds)
    sent = [0]
    deadline = time.monotonic() + seconds
    address = urlparse(url)

    def runner() -> None:
        client = Client(address.hostname, address.port)
        while time.monotonic() < deadline:
            with lock:
                kind = next(work, None)
                if kind is None:
                    return
                sent[0] += 1
            one(client, kind, outcomes, wrong, lock)

    threads = [threading.Thread(target=runner) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes, wrong, sent[0]


def large_one(client: Client, rng: random.Random, outcomes: Counter, wrong: list, lock) -> None:
    nonce = uuid.uuid4().hex
    blob_len, reply_bytes = rng.randint(0, MAX_BLOB), rng.randint(0, MAX_BLOB)
    body = {"nonce": nonce, "blob": "x" * blob_len, "reply_bytes": reply_bytes}
    try:
        status, answer = client.post(body, timeout=60, **{"x-corral-timeout-ms": "20000"})
        if status == 200:
            right = answer == {"nonce": nonce, "blob_len": blob_len, "reply": "y" * reply_bytes}
            outcome, problem = ("large ok", None) if right else ("large WRONG", (status, nonce))
        elif status == 500 and answer.get("error") == "worker_died":
            # Out of retries: its workers were killed under it more often than it may be retried.
            outcome, problem = "large 500 worker_died", None
        else:
            outcome, problem = f"large {status} {answer.get('error')}", (status, answer)
    except (OSError, http.client.HTTPException) as e:
        outcome, problem = "large ERROR", ("large", repr(e))
    with lock:
        outcomes[outcome] += 1
        if problem:
            wrong.append(problem)


def drive_large(url: str, count: int, concurrency: int, seconds: float, seed: int):
    outcomes: Counter = Counter()
    wrong: list = []
    lock = threading.Lock()
    left = [count]
    stop_at = time.monotonic() + seconds
    address = urlparse(url)

    def runner(n: int) -> None:
        client, rng = Client(address.hostname, address.port), random.Random(seed * 1000 + n)
        while time.monotonic() < stop_at:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            large_one(client, rng, outcomes, wrong, lock)

    threads = [threading.Thread(target=runner, args=(n,)) for n in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes, wrong, count - left[0]


def chaos(system: bench.System, stop: threading.Event, seed: int, done: Counter) -> None:
    """SIGKILLs or SIGSTOPs a random worker every 1-3 s until stopped."""
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(1.0, 3.0)):
        pids = [p for p in bench.process_tree(system.proc.pid) if p != system.proc.pid]
        if not pids:
            continue
        how = rng.choice([signal.SIGKILL, signal.SIGSTOP])
        try:
            os.kill(rng.choice(pids), how)
            done[how.name] += 1
        except ProcessLookupError:
            pass


def large_phase(args, workdir: Path) -> tuple[list[str], list[tuple[str, bool]]]:
    command = [
        args.corral, "--listen", "127.0.0.1:18131", "--socket", "soak-large.sock",
        "--workers", "4", "--max-batch-size", "8", "--max-wait-ms", "2",
        "--batch-timeout-ms", "2000", "--retries", "3", "--max-body-bytes", str(8 << 20),
        "--", sys.executable, str(SIZES),
    ]  # fmt: skip
    system = bench.System("corral", command, "http://127.0.0.1:18131/infer", ("corral",))
    bench.start(system, "large", workdir)
    signals: Counter = Counter()
    try:
        pid = system.proc.pid
        drive_large(system.url, 200, args.large_concurrency, 60, args.seed + 2)
        rss_warm = proxy_rss_kb(pid)
        stop = threading.Event()
        killer = threading.Thread(target=chaos, args=(system, stop, args.seed, signals))
        killer.start()
        started = time.monotonic()
        outcomes, wrong, sent = drive_large(
            system.url, args.large_requests, args.large_concurrency, args.seconds, args.seed
        )
        took = time.monotonic() - started
        stop.set()
        killer.join()
        rss_end = proxy_rss_kb(pid)
    finally:
        bench.stop(system)
    growth = (rss_end - rss_warm) / rss_warm
    verdicts = [
        ("large: every request got exactly one outcome", sum(outcomes.values()) == sent),
        ("large: every 200 was the right answer for its request", not wrong),
        ("large: no request waited out its deadline (no stage stuck)", not any(
            "408" in k for k in outcomes)),
        (f"large: proxy RSS within {LARGE_RSS_MARGIN:.0%} of its RSS after warm-up",
         growth <= LARGE_RSS_MARGIN),
    ]  # fmt: skip
    lines = [
        f"Large frames and misbehaving workers: {sent:,} requests in {took:.0f} s from "
        f"{args.large_concurrency} concurrent clients against 4 workers (batch 8, sending batches "
        "ahead on, --batch-timeout-ms 2000, --retries 3); each body and each answer a random size "
        f"up to 4 MiB; meanwhile {signals['SIGKILL']} workers SIGKILLed and "
        f"{signals['SIGSTOP']} SIGSTOPped at random.",
        "| outcome | count |\n| --- | ---: |\n"
        + "\n".join(f"| {k} | {v:,} |" for k, v in sorted(outcomes.items())),
        f"Proxy RSS {rss_warm / 1024:.1f} MB after warm-up, {rss_end / 1024:.1f} MB at the end "
        f"({growth:+.1%}).",
    ]
    if wrong:
        lines.append("First wrong answers: " + "; ".join(map(str, wrong[:5])))
    return lines, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=480, help="stop early after this long")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--large-requests", type=int, default=3_000)
    parser.add_argument("--large-concurrency", type=int, default=16)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="corral-soak-"))
    command = [
        args.corral, "--listen", "127.0.0.1:18130", "--socket", "soak.sock",
        "--workers", "4", "--max-wait-ms", "2", "--", sys.executable, str(SCRIPTED),
    ]  # fmt: skip
    system = bench.System("corral", command, "http://127.0.0.1:18130/infer", ("corral",))
    bench.start(system, "echo", workdir)
    try:
        pid = system.proc.pid
        warm, _, _ = drive(system.url, 5_000, args.concurrency, 60, args.seed + 1)
        rss_warm, fds_warm = proxy_rss_kb(pid), proxy_fds(pid)
        started = time.monotonic()
        outcomes, wrong, sent = drive(
            system.url, args.requests, args.concurrency, args.seconds, args.seed
        )
        took = time.monotonic() - started
        time.sleep(1)  # let cancelled jobs' workers finish and connections close
        rss_end, fds_end = proxy_rss_kb(pid), proxy_fds(pid)
    finally:
        bench.stop(system)

    large_lines, large_verdicts = large_phase(args, workdir)

    answered = sum(outcomes.values())
    growth = (rss_end - rss_warm) / rss_warm
    verdicts = [
        ("every request got exactly one outcome", answered == sent),
        ("every answer was the right one for its request", not wrong),
        (f"proxy RSS within {RSS_MARGIN:.0%} of its RSS after warm-up", growth <= RSS_MARGIN),
        ("no file-descriptor growth", fds_end <= fds_warm),
        *large_verdicts,
    ]
    lines = [
        "## Soak",
        f"Command: `make bench-soak BENCH_ARGS='--requests {args.requests} "
        f"--large-requests {args.large_requests}'` — "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores. "
        f"{sent:,} requests in {took:.0f} s ({sent / took:,.0f} req/s) from {args.concurrency} "
        "concurrent clients against 4 scripted workers, after a 5,000-request warm-up; the mix: "
        "96% valid (each echoing its own nonce), 3% invalid (422 with their own message), 0.5% "
        "slow with a 10 ms deadline (408, or 503 when the prediction says it cannot make it), "
        "0.5% cancelled by the client after 10 ms.",
        "| outcome | count |\n| --- | ---: |\n"
        + "\n".join(f"| {k} | {v:,} |" for k, v in sorted(outcomes.items())),
        f"Proxy RSS {rss_warm / 1024:.1f} MB after warm-up, {rss_end / 1024:.1f} MB at the end "
        f"({growth:+.1%}); open file descriptors {fds_warm} after warm-up, {fds_end} at the end.",
    ]
    if wrong:
        lines.append("First wrong answers: " + "; ".join(map(str, wrong[:5])))
    lines += large_lines
    lines.append("\n".join(f"- {'PASS' if ok else 'FAIL'}: {what}" for what, ok in verdicts))
    section = "\n\n".join(lines)
    bench.replace_section(Path(args.out), section)
    print(section)
    print(f"(warm-up outcomes: {dict(warm)})")
    if not all(ok for _, ok in verdicts):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
