"""Memory per large JSON request: the proxy's peak resident memory (VmHWM) for one request whose
body is 16 MiB of small numbers, on this build of Corral and, beside it, an earlier binary
(`--corral-before BIN`). The physical floor is the body itself.

Three requests, each to a fresh proxy (a peak never falls): an Open Inference Protocol v2
request of one UINT8 tensor as JSON `data`, echoed (examples/echo, which answers plain lists, so
the proxy reads them back into a tensor and writes JSON `data` again); a native request of the
same numbers with `x-corral-items: many`, more items than the queue holds (413); an OpenAI
embeddings request with one input that is a list of numbers (400). Run: `make bench-json-memory
BENCH_ARGS='--corral-before BIN'` (without it, this build alone). The results replace the
"JSON memory" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PORT = 18640
MIB = 1024 * 1024


def peak_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def bodies() -> list[tuple[str, str, bytes, dict[str, str]]]:
    count = (16 * MIB - 200) // 2
    zeros = b"[" + b"0," * (count - 1) + b"0]"
    v2 = b'{"inputs":[{"name":"a","shape":[1,%d],"datatype":"UINT8","data":%s}]}' % (count, zeros)
    openai = b'{"model":"m","input":["a",%s]}' % zeros
    json = {"content-type": "application/json"}
    return [
        ("v2 JSON data, echoed", "/v2/models/infer/infer", v2, json),
        ("native, many items (413)", "/infer", zeros, {**json, "x-corral-items": "many"}),
        ("OpenAI, one input of numbers (400)", "/v1/embeddings", openai, json),
    ]


def measure(binary: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, float]:
    """(status, peak MiB over the proxy's own start-up peak) for one request to a fresh proxy."""
    with tempfile.TemporaryDirectory(prefix="corral-json-memory-") as tmp:
        config = Path(tmp) / "corral.toml"
        config.write_text(
            "[stages.echo]\n"
            f'command = ["{sys.executable}", "{ROOT / "examples" / "echo" / "worker.py"}"]\n'
            '[routes.infer]\npipeline = "echo"\npath = "/infer"\n'
            '[routes.embed]\npipeline = "echo"\nprotocol = "openai-embeddings"\n'
        )
        command = [binary, "--listen", f"127.0.0.1:{PORT}", "--socket", f"{tmp}/c.sock"]
        proc = subprocess.Popen(
            [*command, "--config", str(config), "--timeout-ms", "60000"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{PORT}"
            for _ in range(300):  # until its worker has said hello
                if proc.poll() is not None:
                    raise SystemExit(f"{binary} exited ({proc.returncode}): is port {PORT} free?")
                try:
                    if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            else:
                raise SystemExit(f"{binary} was not ready within 15 s")
            before = peak_mib(proc.pid)
            answer = httpx.post(url + path, content=body, headers=headers, timeout=120)
            return answer.status_code, peak_mib(proc.pid) - before
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corral", default=str(ROOT / "target" / "release" / "corral"))
    parser.add_argument("--corral-before", help="an earlier corral binary, run beside this one")
    args = parser.parse_args()
    systems = [("corral", args.corral)]
    if args.corral_before:
        systems.append(("corral-before", args.corral_before))
    print("| request | system | status | proxy peak over its start, MiB | body, MiB |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, path, body, headers in bodies():
        for system, binary in systems:
            status, grew = measure(binary, path, body, headers)
            print(f"| {name} | {system} | {status} | {grew:,.0f} | {len(body) / MIB:.0f} |")


if __name__ == "__main__":
    main()
