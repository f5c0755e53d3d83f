"""Pipelines, routes and the config file, end to end: the real binary reads a real TOML file,
spawns each stage's workers, and carries every job through the stages of its route."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from openapi_spec_validator import validate

from conftest import BINARY, ROOT, SCRIPTED

ARITH = str(ROOT / "tests" / "workers" / "arith.py")


def command(*args: str) -> str:
    """A TOML array spawning the arith worker with these arguments."""
    return "[" + ", ".join(f'"{part}"' for part in (sys.executable, ARITH, *args)) + "]"


# The classic two-stage example: scale (x*2, two workers, batches of up to 8), then shift
# (x+3, one worker, no batching).
ARITH_TOML = f"""
[stages.scale]
command = {command("scale")}
workers = 2
max_batch_size = 8

[stages.shift]
command = {command("shift")}
workers = 1
max_batch_size = 1

[pipelines.arith]
stages = ["scale", "shift"]
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "corral.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def arith(corral_factory, tmp_path):
    """The ARITH_TOML pipeline; shift holds -2 until the gate opens, at the test's end."""
    gate = tmp_path / "gate"
    proxy = corral_factory(
        "--config", write(tmp_path, ARITH_TOML), worker=None, env={"ARITH_GATE": str(gate)}
    )
    proxy.wait_for_log(r"worker connected", count=3)
    yield proxy
    gate.touch()


def batches(proxy, stage: str) -> tuple[float, float]:
    """(batches, jobs) a stage has sent its workers so far."""
    count = proxy.metric("corral_batch_size_count", stage=stage)
    return count, proxy.metric("corral_batch_size_sum", stage=stage)


def test_a_job_goes_through_both_stages(arith):
    answer = arith.post(3)
    assert answer.status_code == 200, answer.text
    assert answer.json() == 9
    assert batches(arith, "scale") == (1, 1)
    assert batches(arith, "shift") == (1, 1)
    ready = arith.client.get("/readyz").json()
    assert ready["stages"]["scale"]["workers"] == 2
    assert ready["stages"]["shift"]["workers"] == 1


def test_a_thousand_concurrent_requests_all_come_back_right(arith):
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda x: arith.post(x), range(1000)))
    assert [a.status_code for a in answers] == [200] * 1000
    assert [a.json() for a in answers] == [x * 2 + 3 for x in range(1000)]
    # Each stage batched on its own terms: scale up to 8 jobs a batch, shift exactly one.
    scale_batches, scale_jobs = batches(arith, "scale")
    assert scale_jobs == 1000
    assert arith.metric("corral_batch_size_bucket", stage="scale", le="8") == scale_batches
    assert batches(arith, "shift") == (1000, 1000)


def test_an_input_rejected_in_the_first_stage_never_reaches_the_second(arith):
    answer = arith.post("three")
    assert answer.status_code == 422
    assert answer.json()["error"] == "invalid_input"
    assert "expected a number" in answer.json()["message"]
    assert batches(arith, "scale") == (1, 1)
    assert batches(arith, "shift") == (0, 0)


def test_a_failure_in_the_second_stage_answers_500(arith):
    answer = arith.post(600_000)  # scale gives 1.2 million: more than shift takes
    assert answer.status_code == 500
    assert answer.json()["error"] == "worker_error"
    assert "up to a million" in answer.json()["message"]
    assert arith.post(1).json() == 5, "the stage's worker lives on"


def test_a_deadline_passing_in_the_second_stage_answers_408_at_once(arith):
    # 1 s: time to get through `scale` to `shift` on a loaded machine.
    answer = arith.post(-1, headers={"x-corral-timeout-ms": "1000"})
    assert answer.status_code == 408
    assert answer.json()["error"] == "deadline_exceeded"
    # The job reached the second stage: shift's worker still holds it (until the gate opens).
    assert arith.metric("corral_workers_busy", stage="shift") == 1


def test_a_full_later_stage_sheds_the_request(corral_factory, tmp_path):
    text = ARITH_TOML.replace("max_batch_size = 1\n", "max_batch_size = 1\nqueue_capacity = 1\n")
    gate = tmp_path / "gate"
    proxy = corral_factory(
        "--config", write(tmp_path, text), worker=None, env={"ARITH_GATE": str(gate)}
    )
    proxy.wait_for_log(r"worker connected", count=3)
    # Shift's only worker is held until the gate opens; one job then fills shift's queue.
    assert proxy.post(-1, headers={"x-corral-timeout-ms": "1000"}).status_code == 408
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(proxy.post, 1)
        proxy.wait_until(
            lambda: proxy.metric("corral_queue_depth", stage="shift") == 1, what="a queued job"
        )
        answer = proxy.post(2)
        gate.touch()
        assert answer.status_code == 503
        assert answer.json()["error"] == "queue_full"
        assert "retry-after" in answer.headers
        # The queued job goes through once shift's worker is free: (1 * 2) + 3.
        waiting = waiting.result()
        assert (waiting.status_code, waiting.json()) == (200, 5), waiting.text


def test_each_item_of_a_request_goes_through_the_pipeline(arith):
    answer = arith.post([1, 2, 3], headers={"x-corral-items": "many"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == [5, 7, 9]
    answer = arith.post([1, "two", 3], headers={"x-corral-items": "many"})
    assert answer.status_code == 422
    assert [item["index"] for item in answer.json()["items"]] == [1]
    assert batches(arith, "shift")[1] == 3, "the rejected request's items went no further"


def route_at(corral_factory, tmp_path, path: str):
    """A proxy serving the scripted worker on one route at `path`, as a config file writes it."""
    (tmp_path / "corral.toml").write_text(
        f'[stages.a]\ncommand = ["{sys.executable}", "{SCRIPTED}"]\n'
        f'[routes.r]\npipeline = "a"\npath = "{path}"\n'
    )
    proxy = corral_factory("--config", str(tmp_path / "corral.toml"), worker=None)
    proxy.wait_for_log("worker connected")
    return proxy


def test_a_route_path_that_is_not_ascii_is_found_percent_encoded(corral_factory, tmp_path):
    # Clients (httpx, curl) send /résumé as /r%C3%A9sum%C3%A9: matched against the raw path, it
    # was a 404.
    proxy = route_at(corral_factory, tmp_path, "/résumé")
    answer = proxy.client.post("/résumé", json={"x": 1})
    assert answer.request.url.raw_path == b"/r%C3%A9sum%C3%A9"
    assert answer.status_code == 200, answer.text
    assert answer.json()["echo"] == {"x": 1}


def test_a_route_path_written_percent_encoded_is_found_in_either_case(corral_factory, tmp_path):
    # Written encoded, only the same bytes had reached it: `/%c3%bc` (hex digits' case means
    # nothing, RFC 3986) was a 404, though `/ü` written plainly took both.
    proxy = route_at(corral_factory, tmp_path, "/%C3%BC")
    for path in ("/%C3%BC", "/%c3%bc", "/\u00fc"):
        answer = proxy.client.post(path, json={"x": 1})
        assert answer.status_code == 200, (path, answer.text)
    assert proxy.metric("corral_requests_total", route="/%C3%BC", code="200") == 3


def test_two_routes_served_at_once(corral_factory, tmp_path):
    text = (
        ARITH_TOML
        + """
[pipelines.double]
stages = ["scale"]

[routes.infer]
pipeline = "arith"
path = "/infer"

[routes.double]
pipeline = "double"
"""
    )
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    proxy.wait_for_log(r"worker connected", count=3)
    with ThreadPoolExecutor(16) as pool:
        both = list(
            pool.map(
                lambda x: (proxy.post(x).json(), proxy.client.post("/double", json=x).json()),
                range(100),
            )
        )
    assert both == [(x * 2 + 3, x * 2) for x in range(100)]
    assert proxy.metric("corral_requests_total", route="/double", code="200") == 100
    assert proxy.metric("corral_requests_total", route="/infer", code="200") == 100
    assert proxy.client.get("/double").status_code == 405
    assert proxy.client.post("/triple", json=1).status_code == 404
    paths = proxy.client.get("/openapi.json").json()["paths"]
    assert {"/infer", "/double"} <= set(paths)
    assert paths["/double"]["post"]["operationId"] == "double"
    validate(proxy.client.get("/openapi.json").json())


def test_a_stage_listed_twice_is_not_cancelled_by_its_first_step(corral_factory, tmp_path):
    """The request comes back to the stage under the same job id; the end of its first step (its
    client's wait there) once reached the worker as a cancel of the second step's job, which a
    worker honouring cancels answered: the client got a 500 for a job it still waited for."""
    holding = tmp_path / "holding"
    twice = ROOT / "tests" / "workers" / "twice.py"
    text = (
        f'[stages.refine]\ncommand = ["{sys.executable}", "{twice}"]\nmax_batch_size = 1\n'
        '[pipelines.twice]\nstages = ["refine", "refine"]\n'
        '[routes.infer]\npipeline = "twice"\npath = "/infer"\n'
    )
    proxy = corral_factory(
        "--config", write(tmp_path, text), worker=None, env={"TWICE_HOLDING": str(holding)}
    )
    proxy.wait_for_log("worker connected")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(proxy.post, {"n": 1})
        proxy.wait_until(holding.exists, what="the second step's job held")
        # The worker's next frame is this request's batch, sent ahead, unless a cancel came first.
        assert proxy.post({"n": 2}).json() == {"step": 2}
        answer = first.result(timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"step": 2}


def test_routes_named_like_corrals_own_operations_keep_the_document_valid(corral_factory, tmp_path):
    """A route named `v2_infer` gave /openapi.json two operations of that id: invalid."""
    text = ARITH_TOML + "".join(
        f'[routes.{name}]\npipeline = "arith"\n'
        for name in ("v2_infer", "openai_embeddings", "kserve_v1_predict")
    )
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    document = proxy.client.get("/openapi.json").json()
    ids = [op["operationId"] for path in document["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids)), sorted(ids)
    validate(document)


def test_an_external_worker_names_its_stage(corral_factory, tmp_path):
    text = """
[stages.shift]
max_batch_size = 1
"""
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    worker = subprocess.Popen(
        [sys.executable, ARITH, "where", "--socket", str(proxy.socket), "--stage", "shift"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        proxy.wait_for_log(r"worker connected.*shift|shift.*worker connected")
        assert proxy.post(1).json()["stage"] == "shift"
    finally:
        worker.kill()
        worker.wait()


def test_a_spawned_worker_saying_hello_for_another_stage_is_refused(corral_factory, tmp_path):
    # Taken, it served shift while scale never got a worker: /readyz 503 and every request 408,
    # with nothing logged.
    text = f"""
[stages.scale]
command = {command("scale", "--stage", "shift")}

[stages.shift]
command = {command("shift")}

[pipelines.arith]
stages = ["scale", "shift"]
"""
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    proxy.wait_for_log(r'worker refused.*spawned for stage \\?"scale\\?" and said hello for')
    ready = proxy.client.get("/readyz")
    assert ready.status_code == 503 and "scale" in ready.json()["message"], ready.text
    # Why, beside how its workers exited: refused at every restart.
    assert "the last was refused: this worker was spawned for stage" in ready.json()["message"]


def test_a_spawned_worker_naming_an_unknown_stage_has_readyz_say_why(corral_factory, tmp_path):
    # Refused at its hello (as a version or a malformed hello would be), only the log had said
    # why; /readyz said how it exited.
    text = f"""
[stages.scale]
command = {command("scale", "--stage", "zzz")}

[pipelines.arith]
stages = ["scale"]
"""
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    proxy.wait_for_log(r"worker refused.*unknown stage")
    message = proxy.wait_until(
        lambda: "refused" in (m := proxy.client.get("/readyz").json()["message"]) and m,
        what="/readyz to say why the worker was refused",
    )
    assert 'the last was refused: unknown stage "zzz"; this proxy serves: scale' in message
    # Counted under the stage it was spawned for, the one left without its worker.
    assert proxy.metric("corral_worker_failures_total", stage="scale", reason="refused") >= 1


def test_an_output_larger_than_the_next_stage_takes_fails_its_job_naming_both(
    corral_factory, tmp_path
):
    # README's worker_error row: within the first stage's results frame (64 MiB), past what a
    # job of the next may carry (that less --max-header-bytes and framing).
    text = f"""
max_header_bytes = 1048576

[stages.grow]
command = {command("grow")}

[stages.shift]
command = {command("shift")}

[pipelines.p]
stages = ["grow", "shift"]
"""
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    size = (64 << 20) - (512 << 10)
    answer = proxy.post(size, timeout=120)
    assert answer.status_code == 500, answer.text[:300]
    body = answer.json()
    assert body["error"] == "worker_error", body
    assert 'stage "grow" produced' in body["message"], body
    assert 'than stage "shift" takes' in body["message"], body
    assert answer.headers["x-request-id"]


def test_a_spawned_launcher_may_start_the_worker_of_a_stage_without_a_command(
    corral_factory, tmp_path
):
    # One command serving its own stage and one whose workers Corral does not spawn: let in.
    launcher = f"{sys.executable} {ARITH} shift --stage shift & exec {sys.executable} {ARITH} scale"
    text = f"""
[stages.scale]
command = ["sh", "-c", "{launcher}"]

[stages.shift]

[pipelines.arith]
stages = ["scale", "shift"]
"""
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    proxy.wait_for_log(r"worker connected", count=2)
    assert proxy.post(2).json() == 7  # (2 * 2) + 3


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU pinning is Linux only")
def test_spawned_workers_are_pinned_to_their_cores(corral_factory, tmp_path):
    core = min(os.sched_getaffinity(0))
    text = f"""
[stages.pinned]
command = {command("where")}
cpus = [{core}]
"""
    proxy = corral_factory("--config", write(tmp_path, text), worker=None)
    proxy.wait_for_log(r"worker connected")
    answer = proxy.post(1).json()
    assert answer["cores"] == [core]
    assert answer["stage"] == "pinned", "the spawned worker learned its stage from CORRAL_STAGE"


def test_set_flags_and_variables_win_over_the_file(corral_factory, tmp_path):
    text = f"""
max_wait_ms = 7

[stages.scale]
command = {command("scale")}
max_batch_size = 8
"""
    proxy = corral_factory(
        "--config",
        write(tmp_path, text),
        "--max-batch-size",
        "3",
        worker=None,
        env={"CORRAL_QUEUE_CAPACITY": "5"},
    )
    line = proxy.wait_for_log(r"max_batch_size")
    assert "max_batch_size=3" in line
    assert "max_wait_ms=7" in line, "the file's top level applies where nothing overrides it"
    proxy.wait_for_log(r"worker connected")
    assert proxy.post(4).json() == 8
    answer = proxy.post(list(range(6)), headers={"x-corral-items": "many"})
    assert answer.status_code == 413, "CORRAL_QUEUE_CAPACITY=5 holds at most 5 items"


def run_config(tmp_path: Path, text: str | None, *args: str) -> subprocess.CompletedProcess:
    command = [BINARY, "--listen", "127.0.0.1:0", "--socket", str(tmp_path / "s.sock")]
    if text is not None:
        command += ["--config", write(tmp_path, text)]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )


STAGE = '[stages.a]\ncommand = ["true"]\n'
TWO = STAGE + '[stages.b]\ncommand = ["true"]\n'

CONFIG_ERRORS = {
    "toml syntax": ("[stages.a\n", "TOML parse error"),
    "unknown key": ("max_batchsize = 3\n" + STAGE, "unknown field `max_batchsize`"),
    "unknown stage key": (STAGE + "batch = 3\n", "unknown field `batch`"),
    "wrong type": (STAGE + 'max_batch_size = "big"\n', "invalid type"),
    "no stage": ("timeout_ms = 100\n", "stages: the file declares no stage"),
    "batch size 0": (STAGE + "max_batch_size = 0\n", "stages.a.max_batch_size: 0 is not in"),
    "top-level value": ("timeout_ms = 0\n" + STAGE, "timeout_ms: must be at least 1"),
    "socket mode": ('socket_mode = "999"\n' + STAGE, "socket_mode"),
    "stage name": ('[stages."a b"]\ncommand = ["true"]\n', "a stage name is"),
    "stage named unknown": (
        '[stages.unknown]\ncommand = ["true"]\n',
        "stages.unknown: `unknown` is the stage label of refused workers' metrics",
    ),
    "sample ratio": (
        "trace_sample_ratio = 2.0\n" + STAGE,
        "trace_sample_ratio: 2 is not a number from 0 to 1",
    ),
    "worker env": ('worker_env = ["NO_VALUE"]\n' + STAGE, "worker_env:"),
    "empty command": ("[stages.a]\ncommand = []\n", "stages.a.command: an empty command"),
    "too many workers": (STAGE + "workers = 5000\n", "stages.a.workers: 5000 is not in"),
    "workers vs cpus": (STAGE + "workers = 2\ncpus = [0]\n", "stages.a.workers: 2 workers but 1"),
    "core twice": (STAGE + "cpus = [0, 0]\n", "stages.a.cpus: core 0 is listed twice"),
    "missing core": (STAGE + "cpus = [4095]\n", "stages.a.cpus: core 4095 is not available"),
    "pin external": ("[stages.a]\ncpus = [0]\n", "stages.a.cpus: only spawned workers"),
    "pipeline unknown stage": (
        STAGE + '[pipelines.p]\nstages = ["a", "c"]\n',
        'pipelines.p.stages[1]: no stage named "c"',
    ),
    "empty pipeline": (STAGE + "[pipelines.p]\nstages = []\n", "pipelines.p.stages: a pipeline"),
    "several stages, no pipeline": (TWO, "pipelines: with several stages"),
    "several pipelines, no route": (
        TWO + '[pipelines.p]\nstages = ["a"]\n[pipelines.q]\nstages = ["b"]\n',
        "routes: with several pipelines",
    ),
    "route to unknown pipeline": (
        STAGE + '[routes.r]\npipeline = "nope"\n',
        'routes.r.pipeline: no pipeline named "nope"',
    ),
    # A lone stage is a pipeline of itself; two are not, and the error says what to write.
    "route to a stage of several, no pipelines": (
        TWO + '[routes.r]\npipeline = "a"\n',
        'routes.r.pipeline: no pipeline named "a" (none declared); with more than one stage, '
        "declare each pipeline as [pipelines.NAME] stages = [...]",
    ),
    "reserved path": (
        STAGE + '[routes.r]\npath = "/metrics"\npipeline = "a"\n',
        "routes.r.path: /metrics is Corral's own route",
    ),
    "not a path": (STAGE + '[routes.r]\npath = "embed"\npipeline = "a"\n', "routes.r.path"),
    "path twice": (
        STAGE
        + '[routes.r]\npath = "/x"\npipeline = "a"\n'
        + '[routes.s]\npath = "/x"\npipeline = "a"\n',
        "routes.s.path: /x is served twice: routes.r serves it too",
    ),
    "a path twice, once percent-encoded": (
        STAGE
        + '[routes.r]\npath = "/%C3%BC"\npipeline = "a"\n'
        + '[routes.s]\npath = "/\u00fc"\npipeline = "a"\n',
        "is served twice: routes.r serves it too",
    ),
    "corral's own path percent-encoded": (
        STAGE + '[routes.r]\npath = "/%6Detrics"\npipeline = "a"\n',
        "routes.r.path: /%6Detrics is Corral's own route",
    ),
    "keep-alive past a day": (
        "stream_keepalive_ms = 99999999999\n" + STAGE,
        "stream_keepalive_ms: 99999999999 is not in 0..=86400000",
    ),
    "a NUL byte in a command": (
        '[stages.a]\ncommand = ["python3", "-c", "pass\\u0000"]\n',
        "stages.a.command: holds a NUL byte",
    ),
    "dot segment in a path": (
        STAGE + '[routes.r]\npath = "/x/../healthz"\npipeline = "a"\n',
        'routes.r.path: "/x/../healthz": a route path has no `.` or `..` segment',
    ),
    # WHATWG URLs (browsers, Node) resolve `%2e%2e` as `..`: such a route was never reached.
    "percent-encoded dot segment in a path": (
        STAGE + '[routes.r]\npath = "/x/%2e%2E/y"\npipeline = "a"\n',
        'routes.r.path: "/x/%2e%2E/y": a route path has no `.` or `..` segment',
    ),
    # A route's name is its model's name in v2 and KServe v1 paths.
    "empty route name": (STAGE + '[routes.""]\npath = "/e"\npipeline = "a"\n', 'routes."": a'),
    "slash in a route name": (
        STAGE + '[routes."a/b"]\npath = "/ab"\npipeline = "a"\n',
        'routes."a/b": a route name is its model\'s name in v2 and KServe v1 paths',
    ),
    "a dot segment as a route name": (
        STAGE + '[routes.".."]\npath = "/up"\npipeline = "a"\n',
        'routes."..": a route name',
    ),
    "colon in a route name": (
        STAGE + '[routes."x:predict"]\npath = "/x"\npipeline = "a"\n',
        'routes."x:predict": a route name',
    ),
    "unused pipeline": (
        STAGE + '[pipelines.p]\nstages = ["a"]\n[pipelines.q]\nstages = ["a"]\n'
        '[routes.r]\npipeline = "p"\n',
        "pipelines.q: no route serves this pipeline",
    ),
    "unknown protocol": (
        STAGE + '[routes.r]\npipeline = "a"\nprotocol = "openai-embedding"\n',
        'routes.r.protocol: "openai-embedding" is not a protocol Corral speaks '
        "(protocols: openai-embeddings)",
    ),
    "protocol twice": (
        STAGE
        + '[routes.r]\npipeline = "a"\nprotocol = "openai-embeddings"\n'
        + '[routes.s]\npipeline = "a"\nprotocol = "openai-embeddings"\n',
        "routes.s.protocol: routes.r speaks this protocol already",
    ),
    "protocol path": (
        STAGE + '[routes.r]\npath = "/v1/embeddings"\npipeline = "a"\n',
        "routes.r.path: /v1/embeddings: paths under /v1/ are the client protocols'",
    ),
    "the v2 root as a path": (
        STAGE + '[routes.r]\npath = "/v2"\npipeline = "a"\n',
        "routes.r.path: /v2: paths under /v2/ are the client protocols'",
    ),
    "braces in a path": (
        STAGE + '[routes.r]\npath = "/x/{y}"\npipeline = "a"\n',
        'routes.r.path: "/x/{y}": a route path has no query, fragment, space or brace',
    ),
    # Its path comes from its name: `routes.r.path` had been blamed in a file with no `path`.
    "a route name that makes no path": (
        STAGE + '[routes."a#b"]\npipeline = "a"\n',
        'routes.a#b: its path, made from its name, would be "/a#b": a route path has no query',
    ),
    "a tenant header corral reads already": (
        'tenant_header = "x-corral-priority"\n' + STAGE + '[pipelines.p]\nstages = ["a"]\n',
        "tenant_header: x-corral-priority is a header Corral reads for something else",
    ),
    "unused stage": (
        TWO + '[pipelines.p]\nstages = ["a"]\n',
        "stages.b: no route's pipeline uses this stage",
    ),
    # As `--cpus ''` and `gpus = []` are: the workers had started unpinned.
    "an empty cpus list": (
        '[stages.a]\ncommand = ["true"]\ncpus = []\n',
        "stages.a.cpus: an empty list; leave the key out for no pinning",
    ),
    # serde listed the 40 top-level keys, and not where this one goes.
    "a stage's key at the top level": (
        "cpus = [0]\n" + STAGE,
        "cpus: a stage's own key, not a top-level one: put it under [stages.NAME]",
    ),
}


@pytest.mark.parametrize("case", CONFIG_ERRORS, ids=list(CONFIG_ERRORS))
def test_config_errors_name_the_key_and_nothing_starts(tmp_path, case):
    text, expected = CONFIG_ERRORS[case]
    result = run_config(tmp_path, text)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "listening" not in result.stderr
    assert not (tmp_path / "s.sock").exists()


def test_a_socket_flag_that_cannot_be_bound_is_a_config_error_naming_it(tmp_path):
    # Found at bind, it had exited 1 after binding HTTP.
    command = [BINARY, "--listen", "127.0.0.1:0", "--socket", str(tmp_path / "no" / "s.sock")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert f"--socket: {tmp_path / 'no' / 's.sock'}: the directory" in result.stderr
    assert "listening" not in result.stderr


@pytest.mark.parametrize(
    "socket, problem",
    [
        (f"/tmp/{'s' * 120}.sock", "the path is 130 bytes long"),
        ("/nowhere/at/all/w.sock", "the directory /nowhere/at/all does not exist"),
    ],
)
def test_a_file_s_socket_that_cannot_be_bound_is_a_config_error_naming_its_key(
    tmp_path, socket, problem
):
    # Found at bind, it had been named `--socket`, and the exit was 1.
    path = write(tmp_path, f'socket = "{socket}"\n[stages.a]\n')
    command = [BINARY, "--listen", "127.0.0.1:0", "--config", path]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"config file {path}: socket: {socket}: {problem}" in result.stderr, result.stderr
    assert "listening" not in result.stderr


def test_a_relative_socket_too_long_once_made_absolute_is_a_config_error(tmp_path):
    # Short as written, long from the working directory: it passed the check, failed at bind
    # (named `--socket` for a file's key), and the exit was 1 after HTTP was bound.
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    path = write(tmp_path, 'socket = "w.sock"\n[stages.a]\n')
    length = len(str(deep / "w.sock"))
    for args in (["--config", path], ["--socket", "w.sock"]):
        command = [BINARY, "--listen", "127.0.0.1:0", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=deep)
        assert result.returncode == 2, result.stderr
        key = "socket" if args[0] == "--config" else "--socket"
        said = f"{key}: w.sock: the path, made absolute, is {length} bytes long"
        assert said in result.stderr, result.stderr
        assert "listening" not in result.stderr


def test_a_file_s_socket_overridden_by_the_flag_or_its_variable_is_not_checked(tmp_path):
    # A directory only production has (a container's volume): the override is what is bound.
    text = 'socket = "/nowhere/at/all/w.sock"\n[stages.a]\n'
    path = write(tmp_path, text)
    ours = str(tmp_path / "here.sock")
    for args, env in [(["--socket", ours], {}), ([], {"CORRAL_SOCKET": ours})]:
        command = [BINARY, "--listen", "127.0.0.1:0", "--config", path, *args]
        proxy = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
        )
        try:
            for line in proxy.stderr:
                if "listening for workers" in line:
                    break
            else:
                raise AssertionError(f"exited {proxy.wait()}")
            assert ours in line, line
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
            proxy.stderr.close()
    # A file where the directory should be is said to be one.
    (tmp_path / "afile").write_text("")
    command = [BINARY, "--listen", "127.0.0.1:0", "--socket", str(tmp_path / "afile" / "s.sock")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'afile'} is not a directory" in result.stderr


def test_a_missing_config_file_is_an_error(tmp_path):
    result = run_config(tmp_path, None, "--config", str(tmp_path / "nowhere.toml"))
    assert result.returncode == 2
    assert "cannot read the config file" in result.stderr


def test_a_command_line_worker_needs_a_single_stage_file(tmp_path):
    result = run_config(tmp_path, TWO, "--", "true")
    assert result.returncode == 2
    assert "exactly one stage" in result.stderr


@pytest.mark.parametrize("flag", ["--timeout-ms", "--max-body-bytes", "--stream-timeout-ms"])
def test_a_flag_that_must_be_at_least_one_says_so_as_the_file_does(tmp_path, flag):
    # clap's range said "0 is not in 1..18446744073709551615", a half-open range that left out
    # the largest value it takes.
    command = [BINARY, "--socket", str(tmp_path / "s.sock"), flag, "0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"invalid value '0' for '{flag}" in result.stderr
    assert "must be at least 1" in result.stderr and "1.." not in result.stderr


def test_a_bad_value_from_a_variable_names_the_variable(tmp_path):
    """clap names the flag only; in a manifest's `env:` list the flag is nowhere to be seen."""
    command = [BINARY, "--socket", str(tmp_path / "s.sock")]
    env = {**os.environ, "CORRAL_MAX_BATCH_SIZE": "abc"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2
    assert "invalid value 'abc' for '--max-batch-size" in result.stderr
    assert "CORRAL_MAX_BATCH_SIZE" in result.stderr
    # Given on the command line too, the flag's value is the bad one, and the variable unused.
    flag = subprocess.run(
        [*command, "--max-batch-size=x"], capture_output=True, text=True, timeout=30, env=env
    )
    assert flag.returncode == 2 and "invalid value 'x'" in flag.stderr
    assert "CORRAL_MAX_BATCH_SIZE" not in flag.stderr


def test_a_value_that_is_not_utf8_names_its_variable(tmp_path):
    """clap said only "invalid UTF-8 was detected in one or more arguments": no variable."""
    command = [BINARY, "--socket", str(tmp_path / "s.sock")]
    env = {**os.environb, b"CORRAL_MAX_BATCH_SIZE": b"\xff"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2
    assert "CORRAL_MAX_BATCH_SIZE (--max-batch-size) holds bytes that are not UTF-8" in (
        result.stderr
    ), result.stderr


def test_help_documents_the_config_file():
    result = subprocess.run([BINARY, "--help"], capture_output=True, text=True, timeout=30)
    assert "--config <FILE>" in result.stdout
    assert "[pipelines.arith]" in result.stdout
    assert "[routes.infer]" in result.stdout


def test_a_stream_timeout_on_a_stage_last_in_no_route_is_warned_of(corral_factory, tmp_path):
    # Only a route's last stage gives streamed answers: `a`'s own stream_timeout_ms bounds
    # nothing, and was taken without a word; `b`'s, the last stage's, is used.
    (tmp_path / "corral.toml").write_text(
        f'[stages.a]\ncommand = ["{sys.executable}", "{SCRIPTED}"]\nstream_timeout_ms = 1000\n'
        f'[stages.b]\ncommand = ["{sys.executable}", "{SCRIPTED}"]\nstream_timeout_ms = 2000\n'
        '[pipelines.p]\nstages = ["a", "b"]\n[routes.r]\npipeline = "p"\npath = "/r"\n'
    )
    proxy = corral_factory("--config", str(tmp_path / "corral.toml"), worker=None)
    warned = proxy.wait_for_log(r"stream_timeout_ms is not used")
    assert "stage=a" in warned, warned
    proxy.wait_for_log("worker connected", count=2)
    assert not [line for line in proxy.lines if "not used" in line and "stage=b" in line]
