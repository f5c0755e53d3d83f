"""Corral against MOSEC, side by side in one run: same worker logic, same settings (one worker
process, max batch 32, max wait 10 ms), same load generator (oha), on this machine.

Run with `make bench` (builds everything it needs first). For each workload both servers are
started, then every load point is measured on each server in turn, `--repeats` times with the
order alternating, and the medians are reported. Output: a markdown report (BENCHMARKS.md's
"Latest run" section is replaced by it) and a PNG of p99 latency against throughput.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import workloads  # bench/ is on sys.path: this file runs as a script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


BODY = json.dumps({"x": [1.0, 2.0, 3.0, 4.0]})
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class System:
    name: str
    command: list[str]
    url: str
    proxy_names: tuple[str, ...]  # process names that count as "proxy" CPU; the rest is worker
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log: Path | None = None


@dataclass
class Sample:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    ok: int
    proxy_cpu_per_1k: float
    worker_cpu_per_1k: float


@dataclass
class Row:
    workload: str
    load: str
    system: str
    samples: list[Sample] = field(default_factory=list)
    peak_rss_mb: float = 0.0

    def median(self, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in self.samples)


# -- processes ---------------------------------------------------------------------------------


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def cpu_and_rss(system: System) -> tuple[float, float, float]:
    """(proxy CPU s, worker CPU s, peak RSS MB) summed over the system's process tree."""
    proxy = worker = rss_kb = 0.0
    for pid in process_tree(system.proc.pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / CLK_TCK
        if name in system.proxy_names:
            proxy += seconds
        else:
            worker += seconds
        hwm = re.search(r"VmHWM:\s+(\d+)", status)
        rss_kb += int(hwm.group(1)) if hwm else 0
    return proxy, worker, rss_kb / 1024


def start(system: System, workload: str, workdir: Path, body: str = BODY) -> None:
    system.log = workdir / f"{system.name}-{workload}.log"
    env = {**os.environ, "BENCH_WORKLOAD": workload, "RUST_LOG": "warn", **system.env}
    system.proc = subprocess.Popen(
        system.command,
        cwd=workdir,
        env=env,
        stdout=system.log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180  # a torch model takes a while to load
    while time.monotonic() < deadline:  # no readiness event to await across two products
        if system.proc.poll() is not None:
            raise SystemExit(f"{system.name} exited; see {system.log}")
        try:
            request = urllib.request.Request(
                system.url, data=body.encode(), headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    stop(system)  # not left serving, holding its port, after the run gave up on it
    raise SystemExit(f"{system.name} did not answer within 180 s; see {system.log}")


def package_env(folder: str) -> dict[str, str]:
    """The environment that makes a worker import the `corral` package in `folder` (an earlier
    version, say) before the installed one."""
    return {"PYTHONPATH": os.pathsep.join(p for p in [folder, os.environ.get("PYTHONPATH")] if p)}


def stop(system: System) -> None:
    if system.proc and system.proc.poll() is None:
        os.killpg(system.proc.pid, signal.SIGTERM)
        try:
            system.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(system.proc.pid, signal.SIGKILL)
            system.proc.wait()


# -- load --------------------------------------------------------------------------------------


def oha(
    oha_bin: str,
    url: str,
    seconds: float,
    connections: int,
    rate: int | None,
    body: str = BODY,
    prefix: list[str] | tuple[str, ...] = (),
) -> dict:
    """One oha run's JSON report; `prefix` goes before its command (e.g. `taskset -c 0-13`)."""
    command = [
        *prefix, oha_bin, "--no-tui", "--output-format", "json", "-z", f"{seconds}s",
        "-c", str(connections), "-m", "POST", "-T", "application/json", "-d", body,
        "-t", "10s", url,
    ]  # fmt: skip
    if rate:
        command += ["-q", str(rate)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def answered(report: dict) -> tuple[int, int]:
    """Requests answered 200, and errors, in an oha JSON report."""
    codes = report.get("statusCodeDistribution", {})
    ok = int(codes.get("200", 0))
    errors = sum(int(v) for k, v in codes.items() if k != "200")
    # Requests cut off by the end of the run are not errors of the server.
    errors += sum(
        int(v) for k, v in report.get("errorDistribution", {}).items() if "deadline" not in k
    )
    return ok, errors


def measure(args, system: System, connections: int, rate: int | None, body: str = BODY) -> Sample:
    oha(args.oha, system.url, args.warmup, connections, rate, body)
    proxy0, worker0, _ = cpu_and_rss(system)
    report = oha(args.oha, system.url, args.seconds, connections, rate, body)
    proxy1, worker1, _ = cpu_and_rss(system)
    ok, errors = answered(report)
    percentiles = report["latencyPercentiles"]
    per_1k = 1000 / max(ok, 1)
    return Sample(
        rps=ok / args.seconds,
        p50_ms=(percentiles.get("p50") or 0) * 1000,
        p99_ms=(percentiles.get("p99") or 0) * 1000,
        errors=errors,
        ok=ok,
        proxy_cpu_per_1k=(proxy1 - proxy0) * per_1k,
        worker_cpu_per_1k=(worker1 - worker0) * per_1k,
    )


def rotate(
    args, systems: list[System], workload: str, body: str = BODY, between=None
) -> dict[tuple[str, int], Row]:
    """Every closed-loop load point of `--connections` on every system, `--repeats` times, the
    order alternating so that slow drifts of this noisy machine hit every system alike. Calls
    `between()` once per load point and repeat (a measurement to take in turn with them)."""
    rows: dict[tuple[str, int], Row] = {}
    for connections in [int(c) for c in args.connections.split(",")]:
        for repeat in range(args.repeats):
            if between:
                between()
            for system in systems if repeat % 2 == 0 else systems[::-1]:
                sample = measure(args, system, connections, None, body)
                key = (system.name, connections)
                rows.setdefault(key, Row(workload, f"c={connections}", system.name))
                rows[key].samples.append(sample)
                print(
                    f"c={connections:<4} {system.name:14} {sample.rps:9,.1f} req/s"
                    f"  p50 {sample.p50_ms:7.2f} ms  p99 {sample.p99_ms:7.2f} ms"
                    f"  errors {sample.errors}",
                    flush=True,
                )
    return rows


def options(doc: str, connections: str, seconds: float) -> argparse.ArgumentParser:
    """The options every benchmark program takes: tools, load points, repeats, report file."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--oha", default=str(HERE / ".tools" / "bin" / "oha"))
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--connections", default=connections)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    return parser


# Options that say where the tools, the package or the report are, not what is measured: left
# out of a recorded command; of those that do change it, the name is kept, not the path.
_PATHS = {"--oha", "--corral", "--out", "--python", "--package-before", "--corral-before"}
_NAMED = {"--package-before": "DIR", "--corral-before": "BIN"}


def user_args() -> str:
    """What the user passed through BENCH_ARGS that changes what is measured, for the report's
    command line: paths left out (an earlier package or binary named by its option alone), an
    argument with spaces in double quotes (BENCH_ARGS is in single ones)."""
    argv, passed, named = sys.argv[1:], [], []
    while argv:
        arg = argv.pop(0)
        name = arg.split("=", 1)[0]
        if name in _PATHS:
            if "=" not in arg and argv:
                argv.pop(0)  # its value
            if name in _NAMED:
                named.append(f"{name} {_NAMED[name]}")
            continue
        passed.append(f'"{arg}"' if " " in arg else arg)
    return " ".join(passed + named)


def recorded_command(target: str) -> str:
    """The make command that reproduces this run (`target` with the user's BENCH_ARGS)."""
    passed = user_args()
    return f"make {target}" + (f" BENCH_ARGS='{passed}'" if passed else "")


def lower_median(values: list[float]) -> float:
    """The median; of an even count, the lower middle value (a measured run, not an average)."""
    return sorted(values)[(len(values) - 1) // 2]


def last_cores(count: int) -> list[int]:
    """The last `count` cores this process may run on (Corral refuses cores outside them)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return allowed[-count:]


def siblings(core: int, cpus: Path = Path("/sys/devices/system/cpu")) -> set[int]:
    """The logical cores sharing `core`'s physical core (itself included; itself alone where the
    machine does not say), from sysfs' `cpus` folder (another one in tests)."""
    path = cpus / f"cpu{core}" / "topology" / "thread_siblings_list"
    try:
        listed = path.read_text().strip()
    except OSError:
        return {core}
    found = {core}
    for part in filter(None, listed.split(",")):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


# -- report ------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| workload | load | system | req/s | p50 ms | p99 ms | errors | proxy CPU s/1k req"
        " | worker CPU s/1k req | peak RSS MB |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row.workload} | {row.load} | {row.system} | {row.median('rps'):,.0f}"
            f" | {row.median('p50_ms'):.2f} | {row.median('p99_ms'):.2f}"
            f" | {sum(s.errors for s in row.samples)}"
            f" | {row.median('proxy_cpu_per_1k'):.3f} | {row.median('worker_cpu_per_1k'):.3f}"
            f" | {row.peak_rss_mb:.0f} |"
        )
    return "\n".join(lines)


COLLECTOR = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Collector(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Collector).serve_forever()
"""


def collector(port: int = 18199) -> str:
    """Starts a local OTLP/HTTP endpoint for `corral-traced` in a process of its own (its CPU is
    not the proxy's): it reads each export whole and answers 200, keeping the connection."""
    proc = subprocess.Popen([sys.executable, "-c", COLLECTOR, str(port)])
    atexit.register(proc.terminate)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # no readiness event: a listening socket is the signal
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    return f"http://127.0.0.1:{port}"


def tracing_cost(rows: list[Row]) -> str:
    """Tracing on (`corral-traced`) against off (`corral`): the issue's bounds are proxy CPU per
    request ≤ 1.3× and throughput ≥ 0.8× at echo, 64 clients."""
    lines = [
        "| workload | load | req/s on ÷ off | proxy CPU/req on ÷ off | p99 on ÷ off |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    off = {(r.workload, r.load): r for r in rows if r.system == "corral"}
    for row in rows:
        ref = off.get((row.workload, row.load))
        if row.system != "corral-traced" or ref is None:
            continue
        lines.append(
            f"| {row.workload} | {row.load}"
            f" | {row.median('rps') / max(ref.median('rps'), 1e-9):.2f}×"
            f" | {row.median('proxy_cpu_per_1k') / max(ref.median('proxy_cpu_per_1k'), 1e-9):.2f}×"
            f" | {row.median('p99_ms') / max(ref.median('p99_ms'), 1e-9):.2f}× |"
        )
    return "\n".join(lines)


def ratios(rows: list[Row], baseline: str) -> str:
    lines = [
        f"| workload | load | system | req/s vs {baseline} | p50 vs {baseline}"
        f" | p99 vs {baseline} | CPU/req vs {baseline} | req/s vs ceiling |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = {(r.workload, r.load): r for r in rows if r.system == baseline}
    for row in rows:
        ref = base.get((row.workload, row.load))
        if row.system == baseline or ref is None:
            continue
        cpu = row.median("proxy_cpu_per_1k") + row.median("worker_cpu_per_1k")
        ref_cpu = ref.median("proxy_cpu_per_1k") + ref.median("worker_cpu_per_1k")
        ceiling = (
            f"{row.median('rps') / workloads.CEILING_RPS:.0%}"
            if row.workload.startswith("cost")
            else "—"
        )
        lines.append(
            f"| {row.workload} | {row.load} | {row.system}"
            f" | {row.median('rps') / max(ref.median('rps'), 1e-9):.2f}×"
            f" | {row.median('p50_ms') / max(ref.median('p50_ms'), 1e-9):.2f}×"
            f" | {row.median('p99_ms') / max(ref.median('p99_ms'), 1e-9):.2f}×"
            f" | {cpu / max(ref_cpu, 1e-9):.2f}× | {ceiling} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r.workload for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, workload in zip(axes[0], names):
        for system in sorted({r.system for r in rows}):
            # In load order (1, 8, 64, 256 connections): past saturation the line turns up.
            points = [
                (r.median("rps"), r.median("p99_ms"))
                for r in rows
                if r.workload == workload and r.system == system and r.load.startswith("c=")
            ]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
        ax.set_title(workload)
        ax.set_xlabel("throughput (req/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = options(__doc__, connections="1,8,64,256", seconds=3.0)
    parser.add_argument("--workloads", default="echo,cost,cost_sleep")
    parser.add_argument("--rates", default="500,1500,3000", help="open-loop req/s (cost only)")
    parser.add_argument(
        "--systems",
        default="corral,corral-traced,mosec",
        help="also: corral-fixed, corral-before; corral-traced exports spans to a local collector",
    )
    parser.add_argument(
        "--corral-before",
        help="another corral binary (e.g. built from main before a change), run as corral-before",
    )
    parser.add_argument(
        "--package-before",
        help="a folder holding another corral Python package (e.g. python-client/src of an "
        "earlier checkout), used by corral-before's worker",
    )
    parser.add_argument("--plot", default=str(HERE / "results" / "p99_vs_throughput.png"))
    args = parser.parse_args()

    python = sys.executable
    worker = ["--", python, str(HERE / "corral_worker.py")]

    def corral(name: str, port: int, *extra: str, binary: str | None = None) -> System:
        command = [
            binary or args.corral, "--listen", f"127.0.0.1:{port}", "--socket", f"{name}.sock",
            "--workers", "1", "--max-batch-size", "32", "--max-wait-ms", "10",
            "--queue-capacity", "1024", "--timeout-ms", "10000", *extra, *worker,
        ]  # fmt: skip
        return System(name, command, f"http://127.0.0.1:{port}/infer", ("corral",))

    every = {
        "corral": corral("corral", 18100),
        "corral-fixed": corral("corral-fixed", 18101, "--batch-policy", "fixed"),
        "corral-traced": corral("corral-traced", 18103, "--otlp-endpoint", collector()),
        "corral-before": corral("corral-before", 18102, binary=args.corral_before),
        "mosec": System(
            "mosec",
            [python, str(HERE / "mosec_server.py"), "--port", "18200", "--address", "127.0.0.1",
             "--timeout", "10000", "--log-level", "warning"],
            "http://127.0.0.1:18200/inference",
            ("mosec",),
        ),
    }  # fmt: skip
    if args.package_before:
        every["corral-before"].env = package_env(args.package_before)
    systems = [every[name] for name in args.systems.split(",")]
    loads = [(f"c={c}", int(c), None) for c in args.connections.split(",")]
    rows: list[Row] = []
    workdir = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    for workload in args.workloads.split(","):
        open_loop = [(f"{r}/s", 64, int(r)) for r in args.rates.split(",") if r]
        points = loads + (open_loop if workload == "cost" else [])
        by_key = {}
        for system in systems:
            for label, _, _ in points:
                by_key[(system.name, label)] = Row(workload, label, system.name)
        # All servers run side by side (idle ones cost nothing); each load point alternates
        # between them, so slow drifts of this noisy machine hit every server alike.
        for system in systems:
            start(system, workload, workdir)
        try:
            for label, connections, rate in points:
                for repeat in range(args.repeats):
                    order = systems if repeat % 2 == 0 else systems[::-1]
                    for system in order:
                        sample = measure(args, system, connections, rate)
                        row = by_key[(system.name, label)]
                        row.samples.append(sample)
                        row.peak_rss_mb = max(row.peak_rss_mb, cpu_and_rss(system)[2])
                        print(
                            f"{workload:10} {label:7} {system.name:12} {sample.rps:9,.0f} req/s"
                            f"  p50 {sample.p50_ms:7.2f} ms  p99 {sample.p99_ms:7.2f} ms"
                            f"  errors {sample.errors}",
                            flush=True,
                        )
        finally:
            for system in systems:
                stop(system)
        rows.extend(by_key[(s.name, label)] for label, _, _ in points for s in systems)

    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    plot(rows, Path(args.plot))
    command = recorded_command("bench")
    report = "\n\n".join(
        [
            "## Latest run",
            f"Command: `{command}` — {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
            f"medians of {args.repeats} runs of {args.seconds:g} s after {args.warmup:g} s "
            f"warm-up; oha closed loop at c connections, open loop at fixed rates (cost only). "
            f"Ceiling for cost: {workloads.CEILING_RPS:,.0f} req/s.",
            "### Ratios (Corral ÷ MOSEC; below 1× is better for latency and CPU)",
            ratios(rows, "mosec") if "mosec" in args.systems else "(no baseline in this run)",
            "### Tracing on ÷ off (corral-traced ÷ corral; bounds at echo c=64: CPU ≤ 1.3×, "
            "req/s ≥ 0.8×)",
            tracing_cost(rows)
            if {"corral", "corral-traced"} <= set(args.systems.split(","))
            else "(not in this run)",
            "### Figures",
            table(rows),
            f"![p99 against throughput]({os.path.relpath(args.plot, Path(args.out).parent)})",
        ]
    )
    replace_section(Path(args.out), report)
    print(report)


def replace_section(path: Path, section: str) -> None:
    """Put `section` (starting with its "## Title" line) into the markdown file at `path`, in
    place of the section with the same title, or at the end."""
    title = section.split("\n", 1)[0]
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    before, found, after = text.partition(title + "\n")
    if not found:
        path.write_text(text.rstrip() + "\n\n" + section + "\n")
        return
    rest = after.split("\n## ", 1)
    tail = "\n## " + rest[1] if len(rest) == 2 else ""
    path.write_text(before + section + "\n" + tail)


if __name__ == "__main__":
    main()
