"""End-to-end harness: start the real `corral` binary (built by `make test`, or CORRAL_BIN) with
real Python workers on a real Unix socket, and wait for what it logs instead of sleeping."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
BINARY = os.environ.get("CORRAL_BIN", str(ROOT / "target" / "debug" / "corral"))
SCRIPTED = str(ROOT / "tests" / "workers" / "scripted.py")
ECHO = str(ROOT / "examples" / "echo" / "worker.py")


class Corral:
    """One running proxy. Its stderr (and its spawned workers') is collected line by line."""

    def __init__(
        self,
        tmp_path: Path,
        *args: str,
        worker: str | None = SCRIPTED,
        workers: int = 1,
        env: dict[str, str] | None = None,
        preexec_fn=None,
    ) -> None:
        """`preexec_fn` runs in the child before `corral` starts (e.g. to set a resource limit)."""
        self.socket = tmp_path / "corral.sock"
        command = [BINARY, "--listen", "127.0.0.1:0", "--socket", str(self.socket), *args]
        if worker:
            command += ["--workers", str(workers), "--", sys.executable, worker]
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reading = threading.Event()
        self._reading.set()
        self._pace = 0.0
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "RUST_LOG": "info", **(env or {})},
            cwd=tmp_path,
            preexec_fn=preexec_fn,
        )
        self._collector = threading.Thread(target=self._collect, daemon=True)
        self._collector.start()
        try:
            self._started(worker, workers)
        except BaseException:
            # A proxy that failed to start as the test expected is not left running (no fixture
            # holds it to stop): one whose worker crash-looped had outlived the test run.
            self.proc.kill()
            self.proc.wait()
            raise

    def _started(self, worker: str | None, workers: int) -> None:
        line = self.wait_for_log(r"listening for HTTP")
        self.url = "http://" + re.search(r"addr\W+([\d.]+:\d+)", line).group(1)  # text or JSON
        # Tests share this client across up to 64 threads. With httpx's default of 20 idle
        # connections kept, the pool closes the extras while other threads may be reading on
        # them (a ReadError "Bad file descriptor" in the client, once in a few hundred runs):
        # keep every connection the tests' concurrency opens.
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        self.client = httpx.Client(base_url=self.url, timeout=30, limits=limits)
        if worker:
            self.wait_for_log(r"worker connected", count=workers)

    def _collect(self) -> None:
        for line in self.proc.stdout:
            self._reading.wait()
            if self._pace:
                time.sleep(self._pace)  # a slow log consumer: the pace is what is simulated
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def pause_reading(self) -> None:
        """Stop reading the proxy's output, as a stuck log driver does: once the pipe is full,
        its writes wait."""
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def read_slowly(self, seconds_per_line: float) -> None:
        """Read the proxy's output a line every so often (0: as fast as it comes), as a log
        consumer that keeps moving but falls behind does."""
        self._pace = seconds_per_line

    def wait_for_log(self, pattern: str, count: int = 1, timeout: float = 30) -> str:
        """Block until `count` lines match `pattern`; return the last of them."""
        regex = re.compile(pattern)
        with self._changed:
            ok = self._changed.wait_for(
                lambda: (
                    len([x for x in self.lines if regex.search(x)]) >= count
                    or self.proc.poll() is not None
                ),
                timeout=timeout,
            )
            matches = [x for x in self.lines if regex.search(x)]
        if len(matches) < count:
            log = "\n".join(self.lines[-40:])
            state = "timed out" if not ok else f"exited with {self.proc.poll()}"
            raise AssertionError(f"{state} waiting for {count}x {pattern!r}; log:\n{log}")
        return matches[count - 1]

    def worker_pids(self) -> list[int]:
        """The pid of each worker that has connected so far, in order (from its log line)."""
        with self._changed:
            lines = list(self.lines)
        connected = [line for line in lines if "worker connected" in line]
        return [int(re.search(r"pid\W+(\d+)", line).group(1)) for line in connected]

    def wait_until(self, condition, timeout: float = 30, what: str = "condition"):
        """Poll a condition that has no log line of its own (e.g. queue depth)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples from /metrics that have these labels (0 if none), read with
        Prometheus' own text parser: the labels not given are summed over, as many series of a
        counter are there at 0 from the start (`reason` given, every `class` of it)."""
        text = self.client.get("/metrics").text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    def post(self, body=None, **kwargs) -> httpx.Response:
        if body is not None:
            kwargs["json"] = body
        return self.client.post("/infer", **kwargs)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.client.close()
            # The log pipe ends once the proxy and every worker it spawned have exited.
            self._collector.join(timeout=30)
            if not self._collector.is_alive():
                self.proc.stdout.close()


@pytest.fixture
def corral_factory(tmp_path_factory):
    started: list[Corral] = []

    def start(*args: str, **kwargs) -> Corral:
        proxy = Corral(tmp_path_factory.mktemp("corral"), *args, **kwargs)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        # SIGTERM, not SIGKILL, so that the proxy stops the workers it spawned.
        proxy.stop()
