"""Proxy CPU per request on the client-protocol paths whose values are large: Open Inference
Protocol v2 with binary tensors (1 MiB and 256 KiB of FP32, echoed) and as JSON, and OpenAI
embeddings as floats (32 inputs, 384 floats each). Fast Python workers
(bench/protocol_worker.py), so the proxy's share shows; oha in closed loop.

This build and, beside it, an earlier binary (`--corral-before BIN`) are run alternately, each
path `--rounds` times (2 s warm-up, then `--seconds` measured; proxy CPU from /proc/PID/stat).
Run: `make bench-protocols BENCH_ARGS='--corral-before BIN'`. Prints a Markdown table; the
"Protocol paths, proxy CPU" section of BENCHMARKS.md holds a run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PORT = 18660
TICKS = os.sysconf("SC_CLK_TCK")


def v2_binary(elements: int) -> tuple[bytes, dict[str, str]]:
    data = np.random.default_rng(0).standard_normal(elements).astype("<f4").tobytes()
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, elements],
                "datatype": "FP32",
                "parameters": {"binary_data_size": len(data)},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    headers = {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(head)),
    }
    return head + data, headers


def v2_json(rows: int, width: int) -> tuple[bytes, dict[str, str]]:
    data = np.random.default_rng(0).standard_normal(rows * width).astype("<f4").round(4).tolist()
    tensor = {"name": "INPUT0", "shape": [rows, width], "datatype": "FP32", "data": data}
    body = {"inputs": [tensor]}
    return json.dumps(body).encode(), {"content-type": "application/json"}


def embeddings(inputs: int) -> tuple[bytes, dict[str, str]]:
    texts = [f"sentence number {i} about batching proxies and their workers" for i in range(inputs)]
    body = {"model": "m", "input": texts, "encoding_format": "float"}
    return json.dumps(body).encode(), {"content-type": "application/json"}


def paths() -> list[tuple[str, str, int, tuple[bytes, dict[str, str]]]]:
    """(name, route, clients, (body, headers)) for each path measured."""
    v2 = "/v2/models/echo/infer"
    return [
        ("v2 binary FP32 echo, 1 × 1 MiB", v2, 8, v2_binary(262_144)),
        ("v2 binary FP32 echo, 1 × 256 KiB", v2, 8, v2_binary(65_536)),
        ("v2 JSON FP32, 8 × 256", v2, 8, v2_json(8, 256)),
        ("OpenAI embeddings, 32 inputs × 384 floats", "/v1/embeddings", 16, embeddings(32)),
    ]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def start(binary: str, tmp: str) -> subprocess.Popen:
    config = Path(tmp) / "corral.toml"
    worker = [sys.executable, str(HERE / "protocol_worker.py")]
    config.write_text(
        f"[stages.v2]\ncommand = {json.dumps(worker)}\nmax_batch_size = 8\n"
        f"[stages.embed]\ncommand = {json.dumps(worker)}\nmax_batch_size = 64\n"
        '[pipelines.v2]\nstages = ["v2"]\n[pipelines.embed]\nstages = ["embed"]\n'
        '[routes.echo]\npipeline = "v2"\n'
        '[routes.embed]\npipeline = "embed"\nprotocol = "openai-embeddings"\n'
    )
    command = [binary, "--listen", f"127.0.0.1:{PORT}", "--socket", f"{tmp}/c.sock"]
    proc = subprocess.Popen(
        [*command, "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(300):  # until every stage has a worker
        if proc.poll() is not None:
            raise SystemExit(f"{binary} exited ({proc.returncode}): is port {PORT} free?")
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.terminate()
    raise SystemExit(f"{binary} was not ready within 15 s")


def load(oha: str, url: str, body: Path, headers: dict[str, str], clients: int, seconds: float):
    """oha's JSON summary of a closed-loop run."""
    command = [oha, "--no-tui", "--output-format", "json", "-z", f"{seconds}s", "-c", str(clients)]
    command += ["-m", "POST", "-D", str(body)]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    done = subprocess.run([*command, url], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def measure(oha, proc, url, body, headers, clients, seconds) -> tuple[float, float, int]:
    """(requests/s, proxy CPU µs per request, non-200 answers) over `seconds`."""
    load(oha, url, body, headers, clients, 2)  # warm-up
    cpu, began = cpu_seconds(proc.pid), time.monotonic()
    summary = load(oha, url, body, headers, clients, seconds)
    cpu, elapsed = cpu_seconds(proc.pid) - cpu, time.monotonic() - began
    codes = summary["statusCodeDistribution"]
    ok = int(codes.get("200", 0))
    return ok / elapsed, cpu / max(ok, 1) * 1e6, sum(int(n) for n in codes.values()) - ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--corral-before", help="an earlier corral binary, run beside this one")
    parser.add_argument("--oha", default=str(HERE / ".tools" / "bin" / "oha"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6)
    args = parser.parse_args()
    systems = [("corral", args.corral)]
    if args.corral_before:
        systems.append(("corral-before", args.corral_before))
    results: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-protocols-") as tmp:
        measured = paths()
        files = []
        for i, (_, _, _, (body, _)) in enumerate(measured):
            files.append(Path(tmp) / f"body{i}")
            files[-1].write_bytes(body)
        for _ in range(args.rounds):
            for system, binary in systems:
                proc = start(binary, tmp)
                try:
                    for (name, route, clients, (_, headers)), body in zip(measured, files):
                        url = f"http://127.0.0.1:{PORT}{route}"
                        figures = measure(args.oha, proc, url, body, headers, clients, args.seconds)
                        results.setdefault((name, system), []).append(figures)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
    print("| path | system | req/s (each round) | proxy µs/req (each round) | errors |")
    print("| --- | --- | --- | --- | ---: |")
    for (name, system), rounds in results.items():
        rates = " / ".join(f"{rate:,.0f}" for rate, _, _ in rounds)
        cpus = " / ".join(f"{cpu:,.0f}" for _, cpu, _ in rounds)
        errors = sum(errors for _, _, errors in rounds)
        print(f"| {name} | {system} | {rates} | {cpus} | {errors} |")


if __name__ == "__main__":
    main()
