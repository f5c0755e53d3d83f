"""Streaming: the generation model (examples/generate/) behind Corral and behind MOSEC's SSE, in one
run: time to first chunk and chunks/s at 1, 16 and 64 concurrent streams, and how long a stream
started while a long batch runs waits for its first chunk.

- Closed loop: N clients each open an SSE stream (`--tokens` characters), read it to its end, and
  open the next, for `--seconds`; streams still open then are read to their end, and chunks/s
  counts every chunk over the whole time. Medians of `--repeats`, the order of the systems
  alternating. Each stream must bring exactly `--tokens` chunks, or it counts as an error.
- Joining: `--long-streams` streams of `--long-tokens` characters start together; once each has
  its first chunks, one more stream starts. Its time to first chunk is given in model steps (the
  long streams' time between chunks): without joining it waits for the long batch to end.

Systems: `corral` (`corral --max-batch-size 32 --max-wait-ms 10 -- python
examples/generate/worker.py`), `corral-join` (the same worker with joining on, at most 32 running
so that the running batch is no bigger than the others'), `mosec` (bench/mosec_generate.py: MOSEC's
SSEWorker, max batch 32, max wait 10 ms). Targets (issue #13): Corral's TTFT p50 at 64 streams
≤ 0.5× MOSEC's, chunks/s ≥ 1.5× MOSEC's; with joining, the first chunk within two model steps.

The load generator is asyncio on raw sockets (a small chunked-transfer decoder, events counted
with bytes operations): on two cores a per-event Python parser (httpx's line iterator) would take
CPU from the servers it measures. Its own CPU per 1k chunks is in the report.

Run with `make bench-stream`; the report replaces BENCHMARKS.md's "Streaming" section.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import bench  # bench/ is on sys.path: this file runs as a script
from bench import HERE, ROOT, System

PROMPT = "The "


@dataclass
class Stream:
    """One stream as the client saw it (times from the request, in seconds)."""

    status: int = 0
    chunks: int = 0
    first: float | None = None  # time to the first chunk
    last: float = 0.0  # time of the last chunk
    error: bool = False


async def open_stream(url: str, body: dict, started: asyncio.Event | None = None) -> Stream:
    """POST `body` asking for SSE, read the stream to its end, count its chunks. Sets `started`
    once the first chunk is in."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    request = (
        f"POST {parts.path} HTTP/1.1\r\nhost: {parts.netloc}\r\naccept: text/event-stream\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + payload
    stream = Stream()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        stream.status = int(head.split(b" ", 2)[1])
        chunked = b"transfer-encoding: chunked" in head.lower()
        raw, events = bytearray(), bytearray()  # bytes as received; the body, de-chunked
        size = None  # the size of the HTTP chunk being read; None: its size line comes next
        ended = False
        while not ended:
            data = await reader.read(65536)
            if not data:
                break
            if not chunked:
                events += data
            else:
                raw += data
                while True:  # de-chunk whatever is complete
                    if size is None:
                        line_end = raw.find(b"\r\n")
                        if line_end < 0:
                            break
                        size = int(bytes(raw[:line_end]).split(b";")[0], 16)
                        del raw[: line_end + 2]
                        if size == 0:
                            ended = True
                            break
                    if len(raw) < size + 2:
                        break
                    events += raw[:size]
                    del raw[: size + 2]
                    size = None
            # Count whole events: each ends with a blank line; `event:` ones (done, error) and
            # comments (MOSEC sends `:` to keep an idle stream open) are not chunks. Chunks are
            # JSON, so a blank line never occurs inside one.
            end = events.rfind(b"\n\n")
            if end >= 0:
                whole = b"\n\n" + bytes(events[: end + 2])  # each event now follows a blank line
                del events[: end + 2]
                other = whole.count(b"\n\nevent:") + whole.count(b"\n\n:")
                got = whole.count(b"\n\n") - 1 - other
                stream.error |= b"event: error" in whole
                if got:
                    now = time.perf_counter() - t0
                    if stream.first is None:
                        stream.first = now
                        if started:
                            started.set()
                    stream.chunks += got
                    stream.last = now
    finally:
        writer.close()
    stream.error |= stream.status != 200 or stream.chunks != body["max_tokens"]
    return stream


# -- closed loop -------------------------------------------------------------------------------


@dataclass
class Sample:
    ttft_p50_ms: float
    ttft_p99_ms: float
    chunks_per_s: float
    errors: int
    server_cpu_per_1k: float  # server CPU seconds (proxy and worker) per 1,000 chunks
    client_cpu_per_1k: float  # the load generator's CPU seconds per 1,000 chunks


@dataclass
class Row:
    streams: int
    system: str
    samples: list[Sample] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in self.samples)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def closed_loop(url: str, clients: int, tokens: int, seconds: float) -> tuple[list, float]:
    start = time.perf_counter()
    deadline = start + seconds
    streams: list[Stream] = []

    async def client(index: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            body = {"prompt": PROMPT, "max_tokens": tokens, "seed": index * 100_000 + n}
            try:
                streams.append(await asyncio.wait_for(open_stream(url, body), 60))
            except (OSError, asyncio.TimeoutError, ValueError, IndexError):
                streams.append(Stream(error=True))
            n += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return streams, time.perf_counter() - start


def measure(args, system: System, clients: int) -> Sample:
    asyncio.run(closed_loop(system.url, clients, args.tokens, args.warmup))
    server0, client0 = sum(bench.cpu_and_rss(system)[:2]), time.process_time()
    streams, elapsed = asyncio.run(closed_loop(system.url, clients, args.tokens, args.seconds))
    server1, client1 = sum(bench.cpu_and_rss(system)[:2]), time.process_time()
    chunks = sum(s.chunks for s in streams)
    firsts = [s.first * 1000 for s in streams if s.first is not None]
    per_1k = 1000 / max(chunks, 1)
    return Sample(
        ttft_p50_ms=percentile(firsts, 0.5),
        ttft_p99_ms=percentile(firsts, 0.99),
        chunks_per_s=chunks / elapsed,
        errors=sum(s.error for s in streams),
        server_cpu_per_1k=(server1 - server0) * per_1k,
        client_cpu_per_1k=(client1 - client0) * per_1k,
    )


# -- joining -----------------------------------------------------------------------------------


async def late_stream(args, url: str) -> tuple[float, float]:
    """(time to the late stream's first chunk, model step) in ms, while a long batch runs."""
    started = [asyncio.Event() for _ in range(args.long_streams)]
    body = {"prompt": PROMPT, "max_tokens": args.long_tokens}
    longs = [
        asyncio.create_task(open_stream(url, {**body, "seed": i}, started[i]))
        for i in range(args.long_streams)
    ]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 60)
    await asyncio.sleep(0.05)  # well inside the batch: it has run for some steps
    late = await open_stream(url, {"prompt": PROMPT, "max_tokens": 8, "seed": 999})
    done = await asyncio.wait_for(asyncio.gather(*longs), 120)
    steps = [(s.last - s.first) / (s.chunks - 1) for s in done if s.chunks > 1 and s.first]
    ttft = late.first if late.first is not None else float("nan")
    return ttft * 1000, statistics.median(steps) * 1000


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = bench.options(__doc__, connections="1,16,64", seconds=3.0)
    parser.add_argument("--systems", default="corral,corral-join,mosec")
    parser.add_argument("--tokens", type=int, default=64, help="characters per stream")
    parser.add_argument("--long-streams", type=int, default=8)
    parser.add_argument("--long-tokens", type=int, default=600)
    args = parser.parse_args()

    python = sys.executable
    worker = ["--", python, str(ROOT / "examples" / "generate" / "worker.py")]

    def corral(name: str, port: int, env: dict[str, str]) -> System:
        command = [
            args.corral, "--listen", f"127.0.0.1:{port}", "--socket", f"{name}.sock",
            "--workers", "1", "--max-batch-size", "32", "--max-wait-ms", "10",
            "--timeout-ms", "30000", *worker,
        ]  # fmt: skip
        return System(name, command, f"http://127.0.0.1:{port}/infer", ("corral",), env)

    every = {
        "corral": corral("corral", 18600, {"GENERATE_MAX_RUNNING": "0"}),
        # Joining is the worker's opt-in (issue #13: `max_running`): examples/generate/worker.py.
        "corral-join": corral("corral-join", 18601, {"GENERATE_MAX_RUNNING": "32"}),
        "mosec": System(
            "mosec",
            [python, str(HERE / "mosec_generate.py"), "--port", "18602", "--address", "127.0.0.1",
             "--timeout", "30000", "--log-level", "warning"],
            "http://127.0.0.1:18602/inference",
            ("mosec",),
        ),
    }  # fmt: skip
    systems = [every[name] for name in args.systems.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="corral-stream-"))
    ready = json.dumps({"prompt": PROMPT, "max_tokens": 1})
    rows: dict[tuple[int, str], Row] = {}
    late: dict[str, list[tuple[float, float]]] = {s.name: [] for s in systems}
    for system in systems:
        bench.start(system, "generate", workdir, ready)
    try:
        for clients in [int(c) for c in args.connections.split(",")]:
            for repeat in range(args.repeats):
                for system in systems if repeat % 2 == 0 else systems[::-1]:
                    sample = measure(args, system, clients)
                    rows.setdefault((clients, system.name), Row(clients, system.name))
                    rows[(clients, system.name)].samples.append(sample)
                    print(
                        f"streams={clients:<3} {system.name:12} TTFT p50 {sample.ttft_p50_ms:7.1f}"
                        f" ms  p99 {sample.ttft_p99_ms:7.1f} ms  {sample.chunks_per_s:8,.0f}"
                        f" chunks/s  errors {sample.errors}",
                        flush=True,
                    )
        for repeat in range(args.repeats):
            for system in systems if repeat % 2 == 0 else systems[::-1]:
                ttft, step = asyncio.run(late_stream(args, system.url))
                late[system.name].append((ttft, step))
                print(f"late stream  {system.name:12} TTFT {ttft:7.1f} ms  step {step:5.2f} ms")
    finally:
        for system in systems:
            bench.stop(system)

    parts = [
        "## Streaming",
        f"Command: `{bench.recorded_command('bench-stream')}`"
        f" — {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, one worker per server, "
        f"max batch 32, max wait 10 ms; {args.tokens} characters per stream, closed loop, "
        f"medians of {args.repeats} runs of {args.seconds:g} s after {args.warmup:g} s "
        f"warm-up. Late stream: {args.long_streams} streams of {args.long_tokens} characters "
        "running, then one more.",
        ratios(rows, "mosec") if "mosec" in every and "mosec" in args.systems else "",
        table(rows),
        late_table(late),
    ]
    report = "\n\n".join(part for part in parts if part)  # no ratios without MOSEC
    bench.replace_section(Path(args.out), report)
    print(report)


def table(rows: dict[tuple[int, str], Row]) -> str:
    lines = [
        "| streams | system | TTFT p50 ms | TTFT p99 ms | chunks/s | errors "
        "| server CPU s/1k chunks | load generator CPU s/1k chunks |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (clients, name), row in rows.items():
        lines.append(
            f"| {clients} | {name} | {row.median('ttft_p50_ms'):.1f}"
            f" | {row.median('ttft_p99_ms'):.1f} | {row.median('chunks_per_s'):,.0f}"
            f" | {sum(s.errors for s in row.samples)} | {row.median('server_cpu_per_1k'):.3f}"
            f" | {row.median('client_cpu_per_1k'):.3f} |"
        )
    return "\n".join(lines)


def ratios(rows: dict[tuple[int, str], Row], baseline: str) -> str:
    lines = [
        f"| streams | system | TTFT p50 vs {baseline} (target ≤ 0.5× at 64)"
        f" | chunks/s vs {baseline} (target ≥ 1.5× at 64) |",
        "| ---: | --- | ---: | ---: |",
    ]
    for (clients, name), row in rows.items():
        ref = rows.get((clients, baseline))
        if name == baseline or ref is None:
            continue
        lines.append(
            f"| {clients} | {name}"
            f" | {row.median('ttft_p50_ms') / max(ref.median('ttft_p50_ms'), 1e-9):.2f}×"
            f" | {row.median('chunks_per_s') / max(ref.median('chunks_per_s'), 1e-9):.2f}× |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def late_table(late: dict[str, list[tuple[float, float]]]) -> str:
    lines = [
        "| system | late stream's TTFT ms | model step ms | TTFT in steps (target ≤ 2 joining) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, samples in late.items():
        ttft = statistics.median(t for t, _ in samples)
        step = statistics.median(s for _, s in samples)
        lines.append(f"| {name} | {ttft:.1f} | {step:.2f} | {ttft / step:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
