"""Large payloads: 100 kB, 1 MB and 10 MB request bodies through Corral, through MOSEC and through
a server that only reads them (the loopback limit), in one run: p50 and p99 latency and MB/s at
1 and 8 clients, the proxy's peak RSS, and the machine's memcpy bandwidth for context.

- Kinds of request: `raw` bytes (`Content-Type: application/octet-stream`; Corral's `/infer`,
  MOSEC with its `deserialize` handing the body over as it came); `v2`, Open Inference Protocol
  v2 binary tensors (Corral's `/v2/models/default/infer`: a JSON header naming one UINT8 tensor
  of shape [1, size], then its bytes; MOSEC has no v2, so its raw figures are the comparison);
  `json`, at 1 MB only, for contrast (a list of byte values, 1 MB of JSON text, parsed by both).
- Same logic on both servers (bench/payload_worker.py, bench/mosec_payload.py): answer the size
  of the request, or with `--logic echo` the request itself. One worker, max batch 32, max wait
  10 ms, as in the other benchmarks.
- The loopback limit (bench/loopback_server.py): a server that reads each body with `recv_into`
  into a buffer it keeps and answers its size, driven by the same load generator with the same
  bodies. Corral's p50 is reported against it and against MOSEC's.
- The load generator is oha (Rust; bodies from files, sent from memory). A Python client would
  spend its own CPU copying and framing 10 MB bodies on a 2-core machine it shares with the
  servers; oha's cost per request does not grow with the body beyond the kernel's copy, and it
  is the same for every server, the loopback one included.
- Peak RSS: VmHWM of the proxy process alone (Corral's `corral`, MOSEC's `mosec`), reset before
  each kind at each load point (`/proc/PID/clear_refs`); the points run in increasing clients ×
  size, so memory kept from an earlier point is never the larger part of a peak. Corral's RSS
  once idle after each is reported too: what its allocator kept rather than what requests held.

Targets (issue: large payloads): at 10 MB, Corral's p50 within 2× of the loopback limit for the
same bytes and ≤ 0.5× MOSEC's; the proxy's peak RSS bounded by clients × body size plus a
constant.

Run with `make bench-payload` (BENCH_ARGS passes options; `--quick` for a smoke run of a few
seconds a point that prints its report without writing it). The report replaces BENCHMARKS.md's
"Large payloads" section.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import bench  # bench/ is on sys.path: this file runs as a script
from bench import HERE, System

MB = 1_000_000  # sizes and MB/s are decimal: 10 MB is 10,000,000 bytes
V2_PATH = "/v2/models/default/infer"


def parse_size(text: str) -> int:
    """`100k`, `1M`, `10M` (decimal), or a number of bytes."""
    units = {"k": 1000, "m": MB}
    text = text.strip().lower().rstrip("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def label(size: int) -> str:
    return f"{size / MB:g} MB" if size >= MB else f"{size / 1000:g} kB"


# -- bodies ------------------------------------------------------------------------------------


@dataclass
class Body:
    """One request body on disk (oha reads it once and sends it from memory) and what a correct
    answer says: the size the worker sees (bytes, or values for JSON)."""

    kind: str
    size: int  # the body's nominal size
    path: Path
    content_type: str
    expected: int
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return self.path.stat().st_size


def make_bodies(sizes: list[int], kinds: list[str], json_size: int, workdir: Path) -> list[Body]:
    rng = np.random.default_rng(0)
    bodies = []
    for size in sizes:
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        raw = workdir / f"raw-{size}.bin"
        raw.write_bytes(data)
        if "raw" in kinds:
            bodies.append(Body("raw", size, raw, "application/octet-stream", size))
        if "v2" in kinds:
            header = json.dumps(
                {
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "shape": [1, size],
                            "datatype": "UINT8",
                            "parameters": {"binary_data_size": size},
                        }
                    ],
                    "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
                },
                separators=(",", ":"),
            ).encode()
            path = workdir / f"v2-{size}.bin"
            path.write_bytes(header + data)
            headers = {"Inference-Header-Content-Length": str(len(header))}
            bodies.append(Body("v2", size, path, "application/octet-stream", size, headers))
        if "json" in kinds and size == json_size:
            # The same kind of data as JSON: byte values as numbers, exactly `size` bytes of text
            # (whitespace pads the end).
            text = ",".join(map(str, data[: size // 2]))
            cut = text.rfind(",", 0, size - 2)
            values = text[:cut]
            path = workdir / f"json-{size}.json"
            path.write_text(f"[{values}]".ljust(size))
            count = values.count(",") + 1
            bodies.append(Body("json", size, path, "application/json", count))
    return bodies


# -- systems -----------------------------------------------------------------------------------


@dataclass
class Row:
    size: int
    clients: int
    kind: str
    system: str
    body_bytes: int
    samples: list[dict] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(s[key] for s in self.samples)


def url_for(system: System, body: Body) -> str:
    if body.kind == "v2":
        return system.url.rsplit("/", 1)[0] + V2_PATH
    return system.url


def targets(systems: dict[str, System], body: Body) -> list[tuple[str, System]]:
    """(name in the report, server) for each server that takes this kind of body."""
    if body.kind == "raw":
        return [(n, systems[n]) for n in ("corral", "mosec", "loopback") if n in systems]
    if body.kind == "v2":
        return [("corral", systems["corral"])] if "corral" in systems else []
    found = [(n, systems[n]) for n in ("corral", "mosec-json", "loopback") if n in systems]
    return [("mosec" if n == "mosec-json" else n, s) for n, s in found]


def request_headers(body: Body, echo: bool) -> dict[str, str]:
    headers = {"content-type": body.content_type, **body.headers}
    if echo and body.kind == "raw":  # the echoed body comes back raw, not as JSON
        headers["accept"] = "application/octet-stream"
    return headers


def check(system: System, body: Body, echo: bool) -> None:
    """One request, its answer checked: a benchmark of wrong answers measures nothing."""
    payload = body.path.read_bytes()
    headers = request_headers(body, echo)
    request = urllib.request.Request(url_for(system, body), payload, headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer, headers = response.read(), response.headers
    except (OSError, urllib.error.URLError) as e:  # HTTPError too: its body says why
        why = e.read()[:300] if isinstance(e, urllib.error.HTTPError) else e
        raise SystemExit(f"{system.name}: {body.kind} {label(body.size)} failed: {why}") from e
    if system.name == "loopback":  # it knows nothing of kinds: the body's bytes, or the body
        got, want = (answer, payload) if echo else (json.loads(answer), body.nbytes)
    elif body.kind == "v2":
        length = headers.get("inference-header-content-length")
        if length is None:  # all JSON
            output = json.loads(answer)["outputs"][0]
            got = output["data"] if echo else output["data"][0]
        else:
            data = answer[int(length) :]
            got = data if echo else int.from_bytes(data, "little")
        want = payload[-body.size :] if echo else body.expected
    elif echo:
        got = answer if body.kind == "raw" else json.loads(answer)
        want = payload if body.kind == "raw" else json.loads(payload)
    else:
        got, want = json.loads(answer), body.expected
    if got != want:
        shown = repr(got)[:80]
        raise SystemExit(f"{system.name}: wrong answer to {body.kind} {label(body.size)}: {shown}")


def oha(args, url: str, body: Body, seconds: float, clients: int) -> dict:
    command = [
        args.oha, "--no-tui", "--output-format", "json", "-z", f"{seconds}s",
        "-c", str(clients), "-m", "POST", "-D", str(body.path), "-t", "60s",
    ]  # fmt: skip
    for name, value in request_headers(body, args.logic == "echo").items():
        command += ["-H", f"{name}: {value}"]
    result = subprocess.run([*command, url], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def measure(args, system: System, body: Body, clients: int) -> dict:
    url = url_for(system, body)
    oha(args, url, body, args.warmup, clients)
    proxy0, worker0, _ = bench.cpu_and_rss(system)
    report = oha(args, url, body, args.seconds, clients)
    proxy1, worker1, _ = bench.cpu_and_rss(system)
    if system.name == "loopback":  # one process: all of it is the server's own
        proxy0, worker0, proxy1, worker1 = proxy0 + worker0, 0.0, proxy1 + worker1, 0.0
    ok, errors = bench.answered(report)
    percentiles = report["latencyPercentiles"]
    gigabytes = ok * body.nbytes / 1e9
    return {
        "p50_ms": (percentiles.get("p50") or float("nan")) * 1000,
        "p99_ms": (percentiles.get("p99") or float("nan")) * 1000,
        "rps": ok / args.seconds,
        "mb_s": ok * body.nbytes / args.seconds / MB,
        "errors": errors,
        "ok": ok,
        "proxy_s_per_gb": (proxy1 - proxy0) / gigabytes if gigabytes else float("nan"),
        "worker_s_per_gb": (worker1 - worker0) / gigabytes if gigabytes else float("nan"),
    }


# -- memory ------------------------------------------------------------------------------------


def proxy_pid(system: System) -> int | None:
    """The serving process itself: Corral's `corral` (its workers are children), MOSEC's Rust
    `mosec` (a child of the Python launcher, beside the workers)."""
    for pid in bench.process_tree(system.proc.pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.index("(") + 1 : stat.rindex(")")] in system.proxy_names:
            return pid
    return None


def memory_mb(pid: int | None, key: str) -> float:
    """VmHWM (peak) or VmRSS (now) of one process, in MB."""
    if pid is None:
        return float("nan")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    found = re.search(rf"{key}:\s+(\d+) kB", status)
    return int(found.group(1)) * 1024 / MB if found else float("nan")


def reset_peak(pid: int | None) -> None:
    """Start the process's VmHWM over from its current RSS (Linux: 5 > clear_refs)."""
    if pid is not None:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            pass  # then the peak is the run's so far: points run in increasing clients × size


def memcpy(size: int) -> tuple[float, float, float]:
    """(ms, GB/s) of one copy of `size` bytes into memory already in use (numpy), and the ms of
    the same copy into fresh pages (an anonymous mapping, each page faulted in on first write):
    what a buffer costs the first time it is touched, which allocators that keep freed memory
    avoid. Medians of many."""
    src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(src)
    dst[:] = 0
    reused, fresh = [], []
    for _ in range(max(10, min(500, int(5e8 // size)))):
        start = time.perf_counter()
        np.copyto(dst, src)
        reused.append(time.perf_counter() - start)
        with mmap.mmap(-1, size) as pages:
            start = time.perf_counter()
            np.copyto(np.frombuffer(pages, dtype=np.uint8), src)
            fresh.append(time.perf_counter() - start)
    seconds = statistics.median(reused)
    return seconds * 1000, size / seconds / 1e9, statistics.median(fresh) * 1000


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = bench.options(__doc__, connections="1,8", seconds=2.0)
    parser.set_defaults(warmup=0.5)
    parser.add_argument("--sizes", default="100k,1M,10M", help="body sizes (k, M: decimal)")
    parser.add_argument("--kinds", default="raw,v2,json")
    parser.add_argument("--json-size", default="1M", help="the one size JSON is measured at")
    parser.add_argument("--systems", default="corral,mosec,loopback")
    parser.add_argument("--logic", choices=("size", "echo"), default="size")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 repeat of 1 s; report not written"
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.seconds, args.warmup = 1, 1.0, 0.3

    sizes = sorted(parse_size(s) for s in args.sizes.split(","))
    kinds = args.kinds.split(",")
    clients_list = sorted(int(c) for c in args.connections.split(","))
    echo = args.logic == "echo"
    workdir = Path(tempfile.mkdtemp(prefix="corral-payload-"))
    bodies = make_bodies(sizes, kinds, parse_size(args.json_size), workdir)
    largest = max(b.nbytes for b in bodies)
    max_body = largest + MB  # the body limits of both servers, above the largest body

    python = sys.executable
    env = {"BENCH_PAYLOAD_LOGIC": args.logic}

    def mosec(name: str, port: int, kind: str) -> System:
        command = [
            python, str(HERE / "mosec_payload.py"), "--port", str(port), "--address",
            "127.0.0.1", "--timeout", "30000", "--log-level", "warning",
            "--max-request-size", str(max_body),
        ]  # fmt: skip
        url = f"http://127.0.0.1:{port}/inference"
        return System(name, command, url, ("mosec",), {**env, "BENCH_PAYLOAD_KIND": kind})

    corral = [
        args.corral, "--listen", "127.0.0.1:18700", "--socket", "payload.sock",
        "--workers", "1", "--max-batch-size", "32", "--max-wait-ms", "10",
        "--timeout-ms", "30000", "--max-body-bytes", str(max_body),
        "--", python, str(HERE / "payload_worker.py"),
    ]  # fmt: skip
    loopback = [python, str(HERE / "loopback_server.py"), "--port", "18703"]
    every = {
        "corral": System("corral", corral, "http://127.0.0.1:18700/infer", ("corral",), env),
        "mosec": mosec("mosec", 18701, "raw"),
        "mosec-json": mosec("mosec-json", 18702, "json"),
        "loopback": System(
            "loopback",
            loopback + (["--echo"] if echo else []),
            "http://127.0.0.1:18703/",
            ("loopback",),
        ),
    }
    names = args.systems.split(",")
    if "mosec" in names and "json" in kinds:
        names.append("mosec-json")
    systems = {name: every[name] for name in names}

    copies = {size: memcpy(size) for size in sizes}
    for size, (ms, rate, fresh) in copies.items():
        print(f"memcpy {label(size):>6}  {ms:7.3f} ms  {rate:5.1f} GB/s  fresh {fresh:7.3f} ms")

    rows: dict[tuple[int, int, str, str], Row] = {}
    peaks: dict[tuple[int, int, str], dict[str, float]] = {}
    idle: dict[str, float] = {}
    ready = "[1, 2, 3]"  # JSON every server answers (its size: 3; the loopback's: 9)
    for system in systems.values():
        bench.start(system, "payload", workdir, ready)
    try:
        pids = {name: proxy_pid(system) for name, system in systems.items()}
        idle = {name: memory_mb(pid, "VmRSS") for name, pid in pids.items()}
        for size in sizes:
            for clients in clients_list:
                # Kind by kind (raw, v2, json), each with its own peak RSS; the points go in
                # increasing clients × size, so memory an allocator kept from an earlier point
                # is never the larger part of a later one's peak.
                for body in (b for b in bodies if b.size == size):
                    pairs = targets(systems, body)
                    if clients == clients_list[0]:
                        # Checked here, not all at the start: a 10 MB check would raise the RSS
                        # that the smaller points' peaks start from.
                        for _, system in pairs:
                            check(system, body, echo)
                    for pid in pids.values():
                        reset_peak(pid)
                    for repeat in range(args.repeats):
                        # The order alternates: slow drifts of this noisy machine hit all alike.
                        for name, system in pairs if repeat % 2 == 0 else pairs[::-1]:
                            sample = measure(args, system, body, clients)
                            key = (size, clients, body.kind, name)
                            rows.setdefault(key, Row(size, clients, body.kind, name, body.nbytes))
                            rows[key].samples.append(sample)
                            print(
                                f"{label(size):>6} c={clients:<2} {body.kind:4} {name:9}"
                                f" p50 {sample['p50_ms']:8.2f} ms"
                                f"  p99 {sample['p99_ms']:8.2f} ms"
                                f"  {sample['mb_s']:8.1f} MB/s  errors {sample['errors']}",
                                flush=True,
                            )
                    peaks[(size, clients, body.kind)] = {
                        name: memory_mb(pids[system.name], "VmHWM") for name, system in pairs
                    }
                    # What the proxy still holds once idle: memory its allocator kept, not
                    # requests (none is in flight between runs).
                    peaks[(size, clients, body.kind)]["corral after"] = memory_mb(
                        pids.get("corral"), "VmRSS"
                    )
    finally:
        for system in systems.values():
            bench.stop(system)
        for path in [*workdir.glob("*.bin"), *workdir.glob("*.json")]:
            path.unlink()  # tens of MB of bodies; the servers' logs stay for a look

    command = bench.recorded_command("bench-payload")
    report = "\n\n".join(
        [
            "## Large payloads",
            f"Command: `{command}` — {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; "
            f"logic: {'echo the body' if echo else 'answer the body size'}; one worker per "
            "server, max batch 32, max wait 10 ms; oha closed loop, medians of "
            f"{args.repeats} runs of {args.seconds:g} s after {args.warmup:g} s warm-up. "
            "MB/s counts request bodies (decimal MB). CPU per GB of request bodies: proxy is "
            "the serving process (`corral`; MOSEC's Rust server; all of the loopback server), "
            "worker the Python worker processes. MOSEC has no v2 protocol: v2 is compared "
            "with MOSEC's raw bytes, and with the loopback limit for raw bytes of the same size.",
            verdict(rows, sizes, clients_list),
            figures(rows),
            memory(peaks, idle),
            "memcpy on this machine (numpy, one copy, median), into memory in use: "
            + ", ".join(
                f"{label(size)} {ms:.3f} ms ({rate:.1f} GB/s)"
                for size, (ms, rate, _) in copies.items()
            )
            + "; the same copy into fresh pages (each faulted in on first write): "
            + ", ".join(f"{label(size)} {fresh:.2f} ms" for size, (_, _, fresh) in copies.items())
            + ".",
        ]
    )
    if not args.quick or "--out" in sys.argv:
        bench.replace_section(Path(args.out), report)
    print(report)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b and b == b and a == a else "—"


def verdict(rows: dict, sizes: list[int], clients_list: list[int]) -> str:
    """The targets, at the largest size."""
    size = max(sizes)
    lines = [
        f"| {label(size)} | clients | Corral p50 ms | loopback p50 ms | vs loopback (target ≤ 2×)"
        " | MOSEC p50 ms | vs MOSEC (target ≤ 0.5×) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in ("raw", "v2"):
        for clients in clients_list:
            corral = rows.get((size, clients, kind, "corral"))
            if corral is None:
                continue
            # MOSEC and the loopback server take raw bytes only: v2 is held against them.
            loop = rows.get((size, clients, "raw", "loopback"))
            mosec = rows.get((size, clients, "raw", "mosec"))
            c50 = corral.median("p50_ms")
            l50 = loop.median("p50_ms") if loop else float("nan")
            m50 = mosec.median("p50_ms") if mosec else float("nan")
            lines.append(
                f"| {kind} | {clients} | {c50:.2f} | {l50:.2f} | {ratio(c50, l50)}"
                f" | {m50:.2f} | {ratio(c50, m50)} |"
            )
    return "\n".join(lines)


def figures(rows: dict) -> str:
    lines = [
        "| size | clients | kind | system | p50 ms | p99 ms | MB/s | req/s | errors"
        " | proxy CPU s/GB | worker CPU s/GB |",
        "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (size, clients, kind, name), row in rows.items():
        lines.append(
            f"| {label(size)} | {clients} | {kind} | {name} | {row.median('p50_ms'):.2f}"
            f" | {row.median('p99_ms'):.2f} | {row.median('mb_s'):,.0f}"
            f" | {row.median('rps'):,.1f} | {sum(s['errors'] for s in row.samples)}"
            f" | {row.median('proxy_s_per_gb'):.2f} | {row.median('worker_s_per_gb'):.2f} |"
        )
    return "\n".join(lines)


def memory(peaks: dict, idle: dict) -> str:
    """The proxies' peak RSS at each point against clients × size: what is left over is what
    the bound's constant must cover."""
    lines = [
        "| size | clients | kind | clients × size MB | Corral proxy peak RSS MB"
        " | peak − clients × size MB | Corral RSS idle after MB | MOSEC proxy peak RSS MB |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    nan = float("nan")
    for (size, clients, kind), peak in peaks.items():
        held = clients * size / MB
        corral, mosec = peak.get("corral", nan), peak.get("mosec", nan)
        lines.append(
            f"| {label(size)} | {clients} | {kind} | {held:.1f} | {corral:.1f}"
            f" | {corral - held:.1f} | {peak.get('corral after', nan):.1f}"
            f" | {'—' if mosec != mosec else f'{mosec:.1f}'} |"
        )
    head = (
        f"Idle RSS after start: Corral's proxy {idle.get('corral', float('nan')):.1f} MB, "
        f"MOSEC's {idle.get('mosec', float('nan')):.1f} MB."
    )
    return head + "\n\n" + "\n".join(lines)


if __name__ == "__main__":
    main()
