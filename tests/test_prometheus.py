"""A real Prometheus scrapes a real Corral: Debian's `prometheus` (.ci/install-prometheus, which
.ci/run calls, installs it) runs on a free loopback port with a temporary storage directory, the
example configuration in deploy/prometheus/ pointed at the proxy and scraped every second, and the
rules in deploy/prometheus/corral-rules.yml loaded. PromQL through its HTTP API must count the
requests sent, every recording rule must produce a series, and every rule must evaluate healthy.

Scrapes and rule evaluations are events in another process: the test polls the API for them,
with deadlines generous enough for a loaded two-core machine, and asserts no timings.

Without prometheus on PATH the end-to-end test is skipped with the install hint; under CI
(CI set, not "false"/"0") it fails instead. The rule unit tests (`promtool test rules`) run from
`make test`, not from here. The checks that need no Prometheus (the rules name only exported
metrics; docs/OBSERVABILITY.md describes every metric) always run."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import ROOT

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "corral-rules.yml"
EXAMPLE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
METRICS_RS = ROOT / "proxy" / "src" / "metrics.rs"
OBSERVABILITY_MD = ROOT / "docs" / "OBSERVABILITY.md"
INSTALL_HINT = (
    "Debian's prometheus package provides prometheus and promtool: run `make prometheus` "
    "(.ci/install-prometheus: apt-get install prometheus, with sudo when not root); "
    ".ci/run installs it in CI"
)
DEADLINE = 90  # seconds, for each thing waited on in Prometheus


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path:
        return path
    if in_ci():
        pytest.fail(f"{tool} is not installed, and CI must run this test. {INSTALL_HINT}")
    pytest.skip(f"{tool} is not installed. {INSTALL_HINT}")


def rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def exported_metrics() -> set[str]:
    """Every metric name proxy/src/metrics.rs registers."""
    return set(re.findall(r'"(corral_[a-z_]+)"', METRICS_RS.read_text()))


def histograms() -> set[str]:
    text = METRICS_RS.read_text()
    return set(re.findall(r'histogram\(\s*&r,\s*"(corral_[a-z_]+)"', text))


def test_the_rules_read_only_metrics_corral_exports():
    """promtool accepts a rule on a metric that does not exist; this does not."""
    exported, hists = exported_metrics(), histograms()
    assert {"corral_requests_total", "corral_batch_duration_seconds"} <= exported
    assert "corral_batch_duration_seconds" in hists
    for rule in rules():
        # Raw metric names, not the recorded ones (level:metric:operations) that embed them.
        for name in re.findall(r"(?<![:\w])corral_[a-z_]+(?![:\w])", rule["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            where = rule.get("record") or rule["alert"]
            assert name in exported or base in hists, f"{where}: {name} is not exported"


def test_the_docs_describe_every_metric_and_rule():
    text = OBSERVABILITY_MD.read_text()
    for name in exported_metrics():
        assert f"`{name}`" in text, f"docs/OBSERVABILITY.md does not describe {name}"
    for rule in rules():
        name = rule.get("record") or rule["alert"]
        assert f"`{name}`" in text, f"docs/OBSERVABILITY.md does not describe {name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """One Prometheus process on 127.0.0.1, its data in a temporary directory."""

    def __init__(self, binary: str, config: Path, workdir: Path) -> None:
        self.log = workdir / "prometheus.log"
        # A free port can be taken between finding it and Prometheus binding it: then try another.
        for _attempt in range(5):
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            with self.log.open("w") as log:
                self.proc = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=workdir,
                )
            self.client = httpx.Client(base_url=self.url, timeout=10)
            if self._wait_ready():
                return
            self.client.close()
            if "address already in use" not in self.log.read_text():
                break
        raise AssertionError(f"Prometheus did not start; its log:\n{self.log.read_text()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if self.client.get("/-/ready").status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        return False

    def api(self, path: str, **params: str):
        answer = self.client.get(f"/api/v1/{path}", params=params)
        body = answer.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict]:
        """An instant query's result: a list of {"metric": labels, "value": [time, "text"]}."""
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        return data["result"]

    def wait_until(self, condition, what: str):
        """Poll `condition` (a scrape or an evaluation is due every second) until truthy."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"Prometheus exited:\n{self.log.read_text()}"
            value = condition()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(
            f"timed out waiting for {what}; last: {condition()!r}; log:\n{self.log.read_text()}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.client.close()


@pytest.fixture
def prometheus_factory(tmp_path_factory):
    started: list[Prometheus] = []

    def start(config: dict) -> Prometheus:
        workdir = tmp_path_factory.mktemp("prometheus")
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        server = Prometheus(require("prometheus"), path, workdir)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def scrape_config(target: str) -> dict:
    """deploy/prometheus/prometheus.yml, scraping `target` and evaluating every second."""
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROMETHEUS_DIR / f) for f in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    return config


def value(result: list[dict]) -> float | None:
    """The value of a query that returns at most one sample."""
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


@pytest.mark.timeout(300)
def test_prometheus_scrapes_corral_and_evaluates_the_rules(corral_factory, prometheus_factory):
    require("prometheus")
    proxy = corral_factory()
    requests = 25
    # One request before the first scrape, so that the counter exists from then on and the rest
    # show up as an increase (rate() > 0), not as a series that started at its value.
    assert proxy.post({"n": 0}).status_code == 200
    server = prometheus_factory(scrape_config(proxy.url.removeprefix("http://")))
    job = scrape_config("x")["scrape_configs"][0]["job_name"]
    count = 'sum(corral_requests_total{route="/infer",code="200"})'
    server.wait_until(lambda: value(server.query(f'up{{job="{job}"}}')) == 1, "the first scrape")
    server.wait_until(lambda: value(server.query(count)) == 1, "the first request, scraped")

    for n in range(1, requests):
        assert proxy.post({"n": n}).status_code == 200

    # The question the issue asks: how many requests did Corral answer 200 on /infer?
    server.wait_until(lambda: value(server.query(count)) == requests, f"{requests} requests")

    rate = 'job_route_code:corral_requests:rate5m{route="/infer",code="200"}'
    result = server.wait_until(lambda: server.query(f"{rate} > 0"), "a recorded request rate")
    assert result[0]["metric"] == {
        "__name__": "job_route_code:corral_requests:rate5m",
        "job": job,
        "route": "/infer",
        "code": "200",
    }
    # Nothing was shed: the ratio is recorded as 0 (its `or` branch), not left absent.
    shed = server.wait_until(lambda: server.query("job:corral_shed:ratio_rate5m"), "shed ratio")
    assert value(shed) == 0
    # One worker, connected, idle between scrapes (or busy with the last batch).
    busy = server.wait_until(
        lambda: server.query('instance_stage:corral_workers_busy:ratio{stage="default"}'),
        "the workers-busy ratio",
    )
    assert 0 <= value(busy) <= 1
    p99 = server.wait_until(
        lambda: server.query(
            'job_stage:corral_batch_duration_seconds:p99_rate5m{stage="default"} >= 0'
        ),
        "a recorded p99 batch duration",
    )
    assert value(p99) < 30, "the scripted worker answers at once: under the top bucket"

    # Every rule of the file loaded and evaluated without error; every recording rule has a
    # series; no alert is pending or firing for a healthy proxy.
    names = {rule.get("record") or rule["alert"] for rule in rules()}

    def evaluated():
        loaded = [r for g in server.api("rules")["groups"] for r in g["rules"]]
        if {r["name"] for r in loaded} != names or any(r["health"] == "unknown" for r in loaded):
            return None
        return loaded

    loaded = server.wait_until(evaluated, "every rule evaluated")
    for rule in loaded:
        assert rule["health"] == "ok", rule
        assert not rule.get("lastError"), rule
        if rule["type"] == "alerting":
            assert rule["state"] == "inactive", rule
    recorded = [r["name"] for r in loaded if r["type"] == "recording"]
    for name in recorded:
        server.wait_until(lambda name=name: server.query(name), f"a series for {name}")
