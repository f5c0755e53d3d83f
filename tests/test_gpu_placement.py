"""GPU placement without a GPU: spawned workers record the environment they were given, and the
tests check that each sees exactly its device, keeps it across a restart, and that every
placement mistake is a config error naming its key. (The measured GPU run is bench/gpu.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BINARY, ROOT, Corral
from corral import _protocol as protocol

PLACED = str(ROOT / "tests" / "workers" / "placed.py")


def placements(directory) -> dict[int, dict]:
    """The recorded environment of each worker that started, by pid."""
    return {int(p.stem): json.loads(p.read_text()) for p in directory.glob("*.json")}


def by_index(directory, pids) -> dict[str, dict]:
    found = placements(directory)
    return {found[pid]["CORRAL_WORKER_INDEX"]: {**found[pid], "pid": pid} for pid in pids}


def test_two_gpus_two_workers_each_and_a_restart_keeps_its_device(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    env = {"PLACED_DIR": str(records), "PLACED_VARS": "MODEL_DIR,THREADS"}
    proxy = Corral(
        tmp_path, "--gpus", "0,1", "--workers-per-gpu", "2",
        "--worker-env", "MODEL_DIR=/models/{gpu}/w{index}", "--worker-env", "THREADS=4",
        "--", sys.executable, PLACED, worker=None, env=env,
    )  # fmt: skip
    try:
        proxy.wait_for_log("worker connected", count=4)
        placed = by_index(records, proxy.worker_pids())
        assert {i: (w["CUDA_VISIBLE_DEVICES"], w["CORRAL_GPU"]) for i, w in placed.items()} == {
            "0": ("0", "0"), "1": ("0", "0"), "2": ("1", "1"), "3": ("1", "1"),
        }  # fmt: skip
        assert placed["3"]["MODEL_DIR"] == "/models/1/w3"
        assert placed["0"]["THREADS"] == "4"
        ready = proxy.client.get("/readyz").json()
        assert ready["stages"]["default"]["gpus"] == {"0": 2, "1": 2}
        assert proxy.metric("corral_workers_connected_by_gpu", stage="default", gpu="1") == 2

        os.kill(placed["2"]["pid"], signal.SIGKILL)
        proxy.wait_for_log("worker connected", count=5)
        new = proxy.worker_pids()[-1]
        restarted = placements(records)[new]
        assert restarted["CORRAL_WORKER_INDEX"] == "2"
        assert (restarted["CUDA_VISIBLE_DEVICES"], restarted["CORRAL_GPU"]) == ("1", "1")
        proxy.wait_until(
            lambda: (
                proxy.client.get("/readyz").json()["stages"]["default"].get("gpus")
                == {"0": 2, "1": 2}
            ),
            what="the restarted worker counted on its device",
        )
        assert proxy.post({"x": 1}).json() == {"x": 1}
    finally:
        proxy.stop()


@pytest.mark.parametrize("source", ["flag", "variable"])
def test_a_flag_s_value_is_taken_whole_and_the_variable_s_split_at_semicolons(tmp_path, source):
    # A connection string holds `;`: the flag had been split there too, silently, into four
    # variables (and `LIST=8.0;8.6` refused).
    records = tmp_path / "records"
    records.mkdir()
    connection = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=k=="
    env = {"PLACED_DIR": str(records), "PLACED_VARS": "CONN,A,B,AccountName"}
    if source == "flag":
        flags = ["--worker-env", f"CONN={connection}", "--worker-env", "A=1"]
    else:
        flags, env["CORRAL_WORKER_ENV"] = [], ";A=1;B=2;"
    proxy = Corral(tmp_path, *flags, "--", sys.executable, PLACED, worker=None, env=env)
    try:
        proxy.wait_for_log("worker connected")
        [given] = placements(records).values()
        if source == "flag":
            assert (given["CONN"], given["A"], given.get("AccountName")) == (connection, "1", None)
        else:
            assert (given["A"], given["B"], given.get("CONN")) == ("1", "2", None)
    finally:
        proxy.stop()


def test_a_worker_claiming_a_spawned_workers_pid_gets_no_device(tmp_path):
    # A device is the kernel's word on who connected (the socket's peer), not the hello's:
    # an external worker naming a spawned one's pid was counted on that worker's GPU.
    records = tmp_path / "records"
    records.mkdir()
    proxy = Corral(
        tmp_path, "--gpus", "0,1", "--", sys.executable, PLACED, worker=None,
        env={"PLACED_DIR": str(records)},
    )  # fmt: skip
    liar = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proxy.wait_for_log("worker connected", count=2)
        claimed = by_index(records, proxy.worker_pids())["1"]["pid"]
        liar.connect(str(proxy.socket))
        liar.sendall(protocol.encode_frame(protocol.hello("default", claimed, "liar")))
        proxy.wait_for_log("worker connected", count=3)
        ready = proxy.client.get("/readyz").json()["stages"]["default"]
        assert ready["gpus"] == {"0": 1, "1": 1}
        assert proxy.metric("corral_workers_connected_by_gpu", stage="default", gpu="1") == 1
    finally:
        liar.close()
        proxy.stop()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU pinning is Linux only")
def test_cpus_from_the_command_line_pin_each_gpu_worker_to_its_core(tmp_path):
    cores = sorted(os.sched_getaffinity(0))[-2:]
    if len(cores) < 2:
        pytest.skip("needs two cores to pin two workers")
    records = tmp_path / "records"
    records.mkdir()
    proxy = Corral(
        tmp_path, "--gpus", "0,1", "--", sys.executable, PLACED, worker=None,
        env={"PLACED_DIR": str(records), "CORRAL_CPUS": ",".join(map(str, cores))},
    )  # fmt: skip
    try:
        proxy.wait_for_log("worker connected", count=2)
        placed = by_index(records, proxy.worker_pids())
        assert {i: (w["CORRAL_GPU"], w["cores"]) for i, w in placed.items()} == {
            "0": ("0", [cores[0]]), "1": ("1", [cores[1]]),
        }, "worker i on gpus[i] and on cpus[i] alone"  # fmt: skip
        assert proxy.post({"x": 1}).json() == {"x": 1}
    finally:
        proxy.stop()


def thread_cores(pid: int) -> dict[str, list[int]]:
    """The cores each thread of a process may run on, by thread id (its tasks in /proc)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[task.name] = sorted(os.sched_getaffinity(int(task.name)))
        except ProcessLookupError:
            continue  # a thread that ended since the listing (an idle blocking-pool thread)
    return found


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU pinning is Linux only")
def test_the_proxy_and_unpinned_workers_keep_off_a_pinned_workers_core(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two cores: one pinned, one for the rest")
    pinned, rest = allowed[-1], allowed[:-1]
    records = tmp_path / "records"
    records.mkdir()
    (tmp_path / "corral.toml").write_text(
        f"""
        [stages.pinned]
        command = ["{sys.executable}", "{PLACED}"]
        cpus = [{pinned}]

        [stages.free]
        command = ["{sys.executable}", "{PLACED}"]
        env = {{ STAGE = "free" }}

        [pipelines.both]
        stages = ["pinned", "free"]
        """
    )
    env = {"PLACED_DIR": str(records), "PLACED_VARS": "STAGE"}
    proxy = Corral(tmp_path, "--config", str(tmp_path / "corral.toml"), worker=None, env=env)
    try:
        proxy.wait_for_log("worker connected", count=2)
        threads = thread_cores(proxy.proc.pid)
        assert len(threads) > 2, "the runtime's threads, the spawner's and the allocator's"
        assert all(cores == rest for cores in threads.values()), threads
        placed = {w["STAGE"]: w["cores"] for w in placements(records).values()}
        assert placed == {None: [pinned], "free": rest}, "the unpinned worker inherits the rest"
        proxy.wait_for_log("the proxy runs on the cores no worker is pinned to")
    finally:
        proxy.stop()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU pinning is Linux only")
def test_a_proxy_whose_every_core_is_pinned_shares_them(tmp_path):
    # At most two cores for the proxy (a worker on each), however many this machine has.
    allowed = sorted(os.sched_getaffinity(0))[:2]
    records = tmp_path / "records"
    records.mkdir()
    proxy = Corral(
        tmp_path, "--cpus", ",".join(map(str, allowed)), "--", sys.executable, PLACED,
        worker=None, env={"PLACED_DIR": str(records)},
        preexec_fn=lambda: os.sched_setaffinity(0, allowed),
    )  # fmt: skip
    try:
        proxy.wait_for_log("worker connected", count=len(allowed))
        proxy.wait_for_log("every core is pinned to a worker: the proxy shares them")
        assert all(cores == allowed for cores in thread_cores(proxy.proc.pid).values())
        assert proxy.post({"x": 1}).json() == {"x": 1}
    finally:
        proxy.stop()


def test_a_config_files_stage_places_its_workers(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    (tmp_path / "corral.toml").write_text(
        f"""
        [stages.embed]
        command = ["{sys.executable}", "{PLACED}"]
        gpus = [3]
        workers_per_gpu = 2
        env = {{ THREADS = "t{{index}}", DEVICE = "cuda:{{gpu}}" }}
        """
    )
    env = {"PLACED_DIR": str(records), "PLACED_VARS": "THREADS,DEVICE"}
    proxy = Corral(tmp_path, "--config", str(tmp_path / "corral.toml"), worker=None, env=env)
    try:
        proxy.wait_for_log("worker connected", count=2)
        placed = by_index(records, proxy.worker_pids())
        assert placed["0"]["CUDA_VISIBLE_DEVICES"] == placed["1"]["CUDA_VISIBLE_DEVICES"] == "3"
        assert (placed["1"]["THREADS"], placed["1"]["DEVICE"]) == ("t1", "cuda:3")
    finally:
        proxy.stop()


def test_top_level_gpus_place_the_spawned_stage_and_leave_an_external_one_alone(tmp_path):
    # The top level is a default for the stages Corral spawns workers for: one whose workers
    # start elsewhere takes no device. It had refused to start, naming `stages.ext.gpus`, a key
    # the file does not have.
    records = tmp_path / "records"
    records.mkdir()
    (tmp_path / "corral.toml").write_text(
        f"""
        gpus = [5]
        [stages.embed]
        command = ["{sys.executable}", "{PLACED}"]
        [stages.ext]
        [pipelines.both]
        stages = ["embed", "ext"]
        """
    )
    env = {"PLACED_DIR": str(records)}
    proxy = Corral(tmp_path, "--config", str(tmp_path / "corral.toml"), worker=None, env=env)
    try:
        proxy.wait_for_log("worker connected")
        placed = by_index(records, proxy.worker_pids())
        assert placed["0"]["CUDA_VISIBLE_DEVICES"] == "5"
        assert proxy.metric("corral_workers_connected_by_gpu", stage="embed", gpu="5") == 1
    finally:
        proxy.stop()


def test_the_files_top_level_takes_the_tracing_and_worker_env_options(tmp_path):
    # The command line's --otlp-endpoint, --trace-sample-ratio and --worker-env, as the docs
    # promise every option is taken at the top level.
    records = tmp_path / "records"
    records.mkdir()
    (tmp_path / "corral.toml").write_text(
        f"""
        otlp_endpoint = "http://127.0.0.1:9"
        trace_sample_ratio = 0.25
        worker_env = ["MODEL_DIR=/models/{{index}}", "THREADS=1"]
        [stages.embed]
        command = ["{sys.executable}", "{PLACED}"]
        env = {{ THREADS = "8" }}
        """
    )
    env = {"PLACED_DIR": str(records), "PLACED_VARS": "MODEL_DIR,THREADS"}
    proxy = Corral(tmp_path, "--config", str(tmp_path / "corral.toml"), worker=None, env=env)
    try:
        line = proxy.wait_for_log("exporting spans over OTLP")
        assert "127.0.0.1:9/v1/traces" in line and "0.25" in line
        proxy.wait_for_log("worker connected")
        placed = by_index(records, proxy.worker_pids())
        # The top level is a default for every stage: the stage's own env wins over it.
        assert (placed["0"]["MODEL_DIR"], placed["0"]["THREADS"]) == ("/models/0", "8")
    finally:
        proxy.stop()


def test_gpus_all_asks_the_machine(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'GPU 0: Fake H100 (UUID: GPU-a)'\necho 'GPU 1: Fake H100 (UUID: GPU-b)'\n"
    )
    (fake / "nvidia-smi").chmod(0o755)
    records = tmp_path / "records"
    records.mkdir()
    env = {"PLACED_DIR": str(records), "PATH": f"{fake}:{os.environ['PATH']}"}
    proxy = Corral(tmp_path, "--gpus", "all", "--", sys.executable, PLACED, worker=None, env=env)
    try:
        proxy.wait_for_log("worker connected", count=2)
        placed = by_index(records, proxy.worker_pids())
        assert sorted(w["CORRAL_GPU"] for w in placed.values()) == ["0", "1"]
    finally:
        proxy.stop()


def fake_nvidia_smi(directory: Path, script: str) -> str:
    """A PATH whose `nvidia-smi` runs `script` (sh)."""
    directory.mkdir()
    (directory / "nvidia-smi").write_text("#!/bin/sh\n" + script)
    (directory / "nvidia-smi").chmod(0o755)
    return f"{directory}:{os.environ['PATH']}"


def test_gpus_all_asks_once_and_takes_each_device_once(tmp_path):
    """Two stages on `all` ask the machine once between them, and a device listed twice gets
    the workers of one."""
    asked = tmp_path / "asked"
    path = fake_nvidia_smi(
        tmp_path / "bin",
        f"echo asked >> {asked}\necho 'GPU 0: A'\necho 'GPU 1: B'\necho 'GPU 0: A'\n",
    )
    records = tmp_path / "records"
    records.mkdir()
    stage = f'command = ["{sys.executable}", "{PLACED}"]\ngpus = "all"\n'
    config = f"[stages.s]\n{stage}[stages.t]\n{stage}[pipelines.p]\nstages = ['s', 't']\n"
    (tmp_path / "c.toml").write_text(config)
    env = {"PLACED_DIR": str(records), "PATH": path, "PLACED_VARS": "CORRAL_STAGE"}
    proxy = Corral(tmp_path, "--config", str(tmp_path / "c.toml"), worker=None, env=env)
    try:
        proxy.wait_for_log("worker connected", count=4)
        placed = placements(records)
        for stage_name in ("s", "t"):
            gpus = sorted(
                w["CORRAL_GPU"] for w in placed.values() if w["CORRAL_STAGE"] == stage_name
            )
            assert gpus == ["0", "1"], placed
        assert asked.read_text().splitlines() == ["asked"]
    finally:
        proxy.stop()


@pytest.mark.parametrize(
    ("script", "said"),
    [
        # A wedged driver hangs nvidia-smi: the proxy says so and exits rather than sit silent.
        ("exec sleep 120\n", "nvidia-smi: no answer to -L within 10 s (killed)"),
        # nvidia-smi writes its own failures to stdout ("No devices were found", exit 6): read
        # from stderr alone, the reason was dropped.
        (
            "echo 'No devices were found'\nexit 6\n",
            "nvidia-smi -L failed (exit status: 6): No devices were found",
        ),
        # A warning on stderr is not the reason.
        (
            "echo 'WARNING: infoROM is corrupted' >&2\necho 'No devices were found'\nexit 6\n",
            "nvidia-smi -L failed (exit status: 6): No devices were found",
        ),
    ],
    ids=["never_answers", "fails_saying_why", "warns_and_fails"],
)
def test_gpus_all_says_why_nvidia_smi_gave_no_gpu(tmp_path, script, said):
    if any(Path("/proc/driver/nvidia/gpus").glob("*")):
        pytest.skip("this machine has GPUs: `all` finds them")
    path = fake_nvidia_smi(tmp_path / "bin", script)
    result = run(tmp_path, "--gpus", "all", *WORKER, path=path)
    assert result.returncode == 2, result.stderr
    assert said in result.stderr


def test_a_gpu_value_every_stage_gets_is_not_checked_where_no_worker_is_spawned(tmp_path):
    # A stage whose workers start elsewhere uses no environment, and may not be given `gpus`:
    # `{gpu}` in a value every stage gets had been refused there, advising just that.
    records = tmp_path / "records"
    records.mkdir()
    config = (
        'worker_env = ["MODEL_DIR=/models/{gpu}"]\n'
        f'[stages.a]\ncommand = ["{sys.executable}", "{PLACED}"]\ngpus = [3]\n'
        "[stages.b]\n[pipelines.p]\nstages = ['a', 'b']\n"
    )
    (tmp_path / "c.toml").write_text(config)
    env = {"PLACED_DIR": str(records), "PLACED_VARS": "MODEL_DIR"}
    proxy = Corral(tmp_path, "--config", str(tmp_path / "c.toml"), worker=None, env=env)
    try:
        proxy.wait_for_log("worker connected")
        (placed,) = placements(records).values()
        assert placed["MODEL_DIR"] == "/models/3"
    finally:
        proxy.stop()


def test_options_for_spawned_workers_without_a_command_are_warned_of(tmp_path):
    proxy = Corral(tmp_path, "--worker-env", "A=1", "--workers-per-gpu", "2", worker=None)
    try:
        proxy.wait_for_log(
            r"--worker-env \(or a config file's `worker_env`\) sets .* it is not used"
        )
        proxy.wait_for_log(r"--workers-per-gpu .* places workers .* it is not used")
    finally:
        proxy.stop()


def test_options_for_spawned_workers_are_warned_of_with_a_file_of_external_stages(tmp_path):
    # A config file had silenced these warnings whatever its stages: `--workers 5` started none.
    (tmp_path / "c.toml").write_text("[stages.a]\n")
    proxy = Corral(
        tmp_path,
        "--config",
        str(tmp_path / "c.toml"),
        "--workers",
        "5",
        "--worker-env",
        "A=1",
        "--workers-per-gpu",
        "2",
        worker=None,
    )
    try:
        proxy.wait_for_log(r"--workers \(or a config file's `workers`\) counts the workers")
        proxy.wait_for_log(
            r"--worker-env \(or a config file's `worker_env`\) sets .* it is not used"
        )
        proxy.wait_for_log(r"--workers-per-gpu .* places workers .* it is not used")
        stage = proxy.wait_for_log(r"stage.*stage=a")
        assert "workers=0" in stage, stage
    finally:
        proxy.stop()


def test_a_file_s_workers_per_gpu_where_no_device_is_placed_is_warned_of(tmp_path):
    # One file for GPU nodes (CORRAL_GPUS set) and CPU nodes: it keeps starting on the latter.
    (tmp_path / "c.toml").write_text("workers_per_gpu = 2\n" + STAGE)
    proxy = Corral(tmp_path, "--config", str(tmp_path / "c.toml"), worker=None)
    try:
        proxy.wait_for_log(r"--workers-per-gpu .* places workers .* it is not used")
    finally:
        proxy.stop()


def test_a_file_s_top_level_workers_and_worker_env_where_nothing_spawns_are_warned_of(tmp_path):
    # As the flags are: a file's `workers = 4` had started none, silently.
    (tmp_path / "c.toml").write_text('workers = 4\nworker_env = ["A=1"]\n[stages.a]\n')
    proxy = Corral(tmp_path, "--config", str(tmp_path / "c.toml"), worker=None)
    try:
        proxy.wait_for_log(r"--workers \(or a config file's `workers`\) counts the workers")
        proxy.wait_for_log(
            r"--worker-env \(or a config file's `worker_env`\) sets .* it is not used"
        )
    finally:
        proxy.stop()


def run(tmp_path, *args, config: str | None = None, path: str | None = None):
    command = [BINARY, "--listen", "127.0.0.1:0", "--socket", str(tmp_path / "s.sock")]
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        command += ["--config", str(tmp_path / "c.toml")]
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=30, env=env)


WORKER = ["--", sys.executable, PLACED]
# A core this process may run on (pinning to it is allowed).
CORE = str(min(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "0"
STAGE = f'[stages.s]\ncommand = ["{sys.executable}", "{PLACED}"]\n'


@pytest.mark.parametrize(
    "args, config, expected",
    [
        (
            ["--gpus", "0,1", "--workers", "3", *WORKER],
            None,
            "--workers: 3 workers, but --gpus [0, 1] with --workers-per-gpu 1 place 2; leave",
        ),
        (["--cpus", CORE, "--workers", "2", *WORKER], None, "--workers: 2 workers but 1 core in"),
        (
            ["--cpus", CORE, "--gpus", "0,1", *WORKER],
            None,
            "--cpus: 1 core in --cpus, but --gpus [0, 1] with --workers-per-gpu 1 place 2 workers",
        ),
        (["--cpus", "4095", *WORKER], None, "--cpus: core 4095 is not available"),
        (["--cpus", CORE], None, "--cpus: only spawned workers can be pinned"),
        (
            ["--cpus", CORE],
            STAGE + STAGE.replace(".s]", ".t]"),
            "error: --cpus: it pins the workers",
        ),
        (["--gpus", ",", *WORKER], None, "--gpus: an empty list"),
        (["--gpus", "0,0", *WORKER], None, "--gpus: device 0 is listed twice"),
        (["--gpus", "0,,1", *WORKER], None, '--gpus: "0,,1" has an empty entry'),
        (["--gpus", "0,", *WORKER], None, '--gpus: "0," has an empty entry'),
        (["--gpus", "zero", *WORKER], None, '--gpus: "zero" is not a device index'),
        (["--gpus", "all", *WORKER], None, "--gpus: `all` found no GPU"),
        (["--gpus", "0"], None, "--gpus: only spawned workers can be given GPUs"),
        # Said before `all` asks the machine (it had said no GPU was found).
        (["--gpus", "all"], None, "--gpus: only spawned workers can be given GPUs"),
        (
            ["--worker-env", "X={rank}", *WORKER],
            None,
            '--worker-env X: unknown placeholder "{rank}"',
        ),
        (["--worker-env", "X={gpu}", *WORKER], None, "--worker-env X: {gpu} is used but no --gpus"),
        (
            [],
            STAGE + f"cpus = [{CORE}]\n" + STAGE.replace(".s]", ".t]") + f"cpus = [{CORE}]\n"
            "[pipelines.p]\nstages = ['s', 't']\n",
            f"stages.t.cpus: core {CORE} is pinned by stages.s.cpus as well",
        ),
        ([], STAGE + "gpus = []\n", "stages.s.gpus: an empty list"),
        # Under a top-level gpus no stage opts out: the advice says where the devices belong.
        (
            [],
            "gpus = [0]\n" + STAGE + "gpus = []\n",
            "stages.s.gpus: an empty list; leave the key out for no GPUs (a stage under a "
            "top-level gpus or --gpus takes those: set gpus on the stages that use GPUs instead)",
        ),
        # Named where written: the file's top level, not a stage key it never had.
        ([], "gpus = [0]\nworkers_per_gpu = 0\n" + STAGE, "c.toml: workers_per_gpu: 0 is not in"),
        (
            ["--gpus", ",".join(map(str, range(600))), *WORKER],
            "workers_per_gpu = 2\n" + STAGE,
            "--gpus: 600 devices with workers_per_gpu 2 place 1200 workers, more than 1024",
        ),
        (
            [],
            STAGE + "gpus = [0]\nworkers = 2\n",
            "stages.s.workers: 2 workers, but stages.s.gpus [0]",
        ),
        ([], STAGE + 'env = { A = "{foo}" }\n', 'stages.s.env.A: unknown placeholder "{foo}"'),
        ([], STAGE + 'env = { "1A" = "x" }\n', "stages.s.env.1A: an environment variable name"),
        ([], STAGE + 'env = { A = "a\\u0000b" }\n', "stages.s.env.A: holds a NUL byte"),
        ([], STAGE + "gpus = [-1]\n", "-1 is not a device index"),
        # Corral's own: a worker with CORRAL_STAGE set said hello for another stage.
        (
            ["--worker-env", "CORRAL_STAGE=a", *WORKER],
            None,
            "--worker-env: CORRAL_STAGE is Corral's",
        ),
        (
            [],
            STAGE + 'env = { CORRAL_SOCKET = "/x" }\n',
            "stages.s.env.CORRAL_SOCKET: CORRAL_SOCKET",
        ),
        ([], STAGE + "gpus = 0\n", 'expected "all" or a list of device indices'),
        # Keys that shape only what Corral spawns, on a stage it spawns nothing for.
        ([], "[stages.s]\nworkers = 4\n", "stages.s.workers: only shapes the workers Corral"),
        ([], "[stages.s]\nworkers_per_gpu = 2\n", "stages.s.workers_per_gpu: only shapes"),
        ([], '[stages.s]\nenv = { A = "1" }\n', "stages.s.env: only shapes the workers"),
        ([], "[stages.s]\ngpus = [0]\n", "stages.s.gpus: only shapes the workers"),
        ([], "gpus = [0]\n[stages.s]\n", "gpus: only spawned workers can be given GPUs, and no"),
        (["--gpus", "0"], "[stages.s]\n", "error: --gpus: only spawned workers can be given GPUs"),
        # A stage's or the file's workers_per_gpu where nothing is placed on a device.
        ([], STAGE + "workers_per_gpu = 2\n", "stages.s.workers_per_gpu: places workers on"),
        # A value from the command line is named as its flag, not put down to the file.
        (["--workers", "3", "--gpus", "0,1"], STAGE, "error: --workers: 3 workers, but --gpus"),
        (["--gpus", "0,0"], STAGE, "error: --gpus: device 0 is listed twice"),
        (["--worker-env", "A={gpu}"], STAGE, 'error: --worker-env A: {gpu} is used but stage "s"'),
        (
            ["--max-batch-bytes", "67103744"],
            STAGE + "max_batch_size = 4096\n",
            "error: --max-batch-bytes: 67103744 is not in",
        ),
        ([], 'worker_env = ["A={gpu}"]\n' + STAGE, "no gpus, and every stage gets this value"),
        ([], STAGE + 'env = { A = "{gpu}" }\n', 'stage "s" has no gpus: give the stage `gpus`'),
        ([], 'socket = ""\n' + STAGE, "c.toml: socket: an empty path"),
        ([], "max_body_bytes = 0\n" + STAGE, "c.toml: max_body_bytes: must be at least 1"),
        (["--max-body-bytes", "0"], None, "--max-body-bytes"),
        ([], 'otlp_endpoint = "bad"\n' + STAGE, "c.toml: otlp_endpoint: the OTLP endpoint"),
        (["--otlp-endpoint", "bad", *WORKER], None, "error: --otlp-endpoint: the OTLP endpoint"),
        # Named as written (the traces path added to it had read "http:/v1/traces").
        (["--otlp-endpoint", "http://", *WORKER], None, 'the OTLP endpoint "http://" must be'),
        (["--otlp-endpoint", "bad", *WORKER], None, 'the OTLP endpoint "bad" must be'),
        (["--otlp-endpoint", "https://h:4318", *WORKER], None, 'endpoint "https://h:4318" must'),
        # "1 jobs" had been said.
        (
            ["--max-batch-size", "1", "--max-batch-bytes", "999999999", *WORKER],
            None,
            "what a frame of 1 job carries",
        ),
        # Credentials went out as the Host header, and into the log.
        (["--otlp-endpoint", "http://u:p@h:4318"], None, "must not carry a user or password"),
    ],
)
def test_placement_mistakes_are_config_errors_naming_the_key(tmp_path, args, config, expected):
    if "all" in args and any(Path("/proc/driver/nvidia/gpus").glob("*")):
        pytest.skip("this machine has GPUs: `all` finds them")
    result = run(tmp_path, *args, config=config, path="/usr/bin:/bin")
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr, result.stderr
    assert "listening" not in result.stderr


def test_a_value_from_a_variable_is_named_as_its_flag_and_said_to_come_from_it(tmp_path):
    # A manifest's env: list shows no flag: the variable is named, as clap's own errors do.
    command = [BINARY, "--listen", "127.0.0.1:0", "--socket", str(tmp_path / "s.sock"), *WORKER]
    env = {**os.environ, "CORRAL_WORKERS": "3", "CORRAL_GPUS": "0,1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2, result.stderr
    assert "error: --workers: 3 workers, but --gpus [0, 1]" in result.stderr, result.stderr
    assert "the value is CORRAL_WORKERS's, from the environment" in result.stderr, result.stderr


def test_worker_env_needs_a_name(tmp_path):
    result = run(tmp_path, "--worker-env", "novalue", *WORKER)
    assert result.returncode != 0
    assert "is not NAME=VALUE" in result.stderr
