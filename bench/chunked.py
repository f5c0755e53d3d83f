"""Chunked bodies: large raw bodies sent without a `Content-Length` (`Transfer-Encoding:
chunked`, as a client streaming an upload sends them) against the same bodies sent with one, on
this build of Corral and, beside it, an earlier binary (`--corral-before BIN`).

The body sent with its length is the reference: read straight into shared memory, it is the
fastest way a body reaches a worker. A chunked body is kept as it comes and copied once
complete; this measures what that way costs, and what copying it into shared memory (rather
than onto the heap, then through the worker's socket) buys. Load generator: this script's own
HTTP/1.1 client (oha sends no chunked bodies), one keep-alive connection per client thread,
64 KiB chunks; the worker answers the body's size (bench/payload_worker.py). Each system runs
`--runs` times, alternately; reported are the medians of p50 and of the CPU that the proxy and
its worker spent per request. Run: `make bench-chunked
BENCH_ARGS='--corral-before BIN'` (without it, this build alone). The results replace the
"Chunked bodies" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (bench/ on the path first)
from payload import label, parse_size  # noqa: E402

PORT = 18620
CHUNK = 64 * 1024


def system(name: str, binary: str, python: str) -> bench.System:
    command = [
        binary, "--listen", f"127.0.0.1:{PORT}", "--socket", "chunked.sock", "--workers", "1",
        "--max-batch-size", "32", "--max-wait-ms", "10",
        "--", python, str(HERE / "payload_worker.py"),
    ]  # fmt: skip
    # The proxy's CPU is its process's, by name (the kernel keeps 15 characters of it).
    proxy_names = ("corral", Path(binary).name[:15])
    return bench.System(name, command, f"http://127.0.0.1:{PORT}/infer", proxy_names)


def request(body: bytes, chunked: bool) -> list[bytes]:
    """The request's bytes, in the pieces one `sendall` each."""
    head = "POST /infer HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/octet-stream\r\n"
    if not chunked:
        return [f"{head}content-length: {len(body)}\r\n\r\n".encode(), body]
    pieces = [f"{head}transfer-encoding: chunked\r\n\r\n".encode()]
    view = memoryview(body)
    for at in range(0, len(body), CHUNK):
        chunk = view[at : at + CHUNK]
        pieces += [f"{len(chunk):x}\r\n".encode(), chunk, b"\r\n"]
    return [*pieces, b"0\r\n\r\n"]


def read_answer(reader) -> None:
    """Reads one answer (a `content-length` one) and checks it is a 200."""
    status = reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"answer: {status!r}")
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    reader.read(length)


def client(pieces: list[bytes], until: float, warm_until: float, times: list[float]) -> None:
    with socket.create_connection(("127.0.0.1", PORT)) as sock:
        reader = sock.makefile("rb")
        while (start := time.perf_counter()) < until:
            for piece in pieces:
                sock.sendall(piece)
            read_answer(reader)
            if start >= warm_until:
                times.append(time.perf_counter() - start)


def run(found: bench.System, clients: int, pieces: list[bytes], seconds: float, warmup: float):
    """(p50 ms, proxy CPU ms per request, worker CPU ms per request) of one run."""
    times: list[float] = []
    warm_until = time.perf_counter() + warmup
    threads = [
        threading.Thread(target=client, args=(pieces, warm_until + seconds, warm_until, times))
        for _ in range(clients)
    ]
    for thread in threads:
        thread.start()
    while time.perf_counter() < warm_until:
        time.sleep(0.01)  # the CPU counts start with the measured part
    proxy0, worker0, _ = bench.cpu_and_rss(found)
    for thread in threads:
        thread.join()
    proxy1, worker1, _ = bench.cpu_and_rss(found)
    per = 1000 / max(len(times), 1)
    return statistics.median(times) * 1000, (proxy1 - proxy0) * per, (worker1 - worker0) * per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--corral-before", help="an earlier corral binary, measured beside")
    parser.add_argument("--python", default=sys.executable, help="runs the worker")
    parser.add_argument("--sizes", default="1M,10M", help="body sizes (k, M: decimal)")
    parser.add_argument("--clients", default="1", help="client threads (Python: few are clean)")
    parser.add_argument("--seconds", type=float, default=2)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--runs", type=int, default=3, help="runs of each (medians kept)")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args()

    binaries = [("this build", args.corral)]
    if args.corral_before:
        binaries.append(("before", args.corral_before))
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    clients = [int(c) for c in args.clients.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="corral-chunked-"))
    results: dict[tuple, list[tuple[float, float, float]]] = {}
    for repeat in range(args.runs):
        for name, binary in binaries:
            found = system(name, binary, args.python)
            bench.start(found, "chunked", workdir, body="[1, 2, 3]")
            try:
                for size in sizes:
                    body = os.urandom(size)
                    for count in clients:
                        for chunked in (True, False):
                            pieces = request(body, chunked)
                            got = run(found, count, pieces, args.seconds, args.warmup)
                            results.setdefault((size, count, chunked, name), []).append(got)
                            way = "chunked" if chunked else "length"
                            print(
                                f"run {repeat + 1} {name} {size} c={count} {way}: p50 "
                                f"{got[0]:.2f} ms, CPU per request: proxy {got[1]:.2f} ms, "
                                f"worker {got[2]:.2f} ms"
                            )
            finally:
                bench.stop(found)

    lines = [
        "## Chunked bodies",
        "",
        f"Command: `{bench.recorded_command('bench-chunked')}` — {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} cores; raw bodies, the worker answers their size; one worker, max "
        f"batch 32, max wait 10 ms; this script's HTTP/1.1 client, {CHUNK // 1024} KiB chunks; "
        f"CPU of the serving process (`corral`) and of its worker, per request; medians of "
        f"{args.runs} runs of {args.seconds:g} s each after "
        f"{args.warmup:g} s warm-up, the systems alternately.",
        "",
        "| size | clients | binary | way | p50 ms | proxy CPU ms/request | worker CPU ms/request |",
        "| ---: | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for size in sizes:
        for count in clients:
            for name, _ in binaries:
                for chunked in (True, False):
                    runs = results[(size, count, chunked, name)]
                    p50, proxy, worker = (statistics.median(r[i] for r in runs) for i in range(3))
                    way = "chunked" if chunked else "with length"
                    lines.append(
                        f"| {label(size)} | {count} | {name} | {way} | {p50:.2f} | "
                        f"{proxy:.2f} | {worker:.2f} |"
                    )
    section = "\n".join(lines) + "\n"
    bench.replace_section(Path(args.out), section)
    print(section)


if __name__ == "__main__":
    main()
