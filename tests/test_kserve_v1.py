"""KServe v1 end to end: `POST /v1/models/{name}:predict` and `GET /v1/models/{name}` against the
real binary and the scripted worker, which echoes each instance with the size of its batch."""

import base64
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest

from conftest import SCRIPTED

# A batch of 4 is released the moment it is full; the long wait keeps a smaller one from leaving
# early, so 4 instances admitted together can only travel as one batch.
BATCH = ("--max-batch-size", "4", "--max-wait-ms", "2000")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    from conftest import Corral

    corral = Corral(tmp_path_factory.mktemp("kserve"), *BATCH)
    yield corral
    corral.stop()


def predict(proxy, body, model="default", **kwargs):
    return proxy.client.post(f"/v1/models/{model}:predict", json=body, **kwargs)


def test_instances_share_a_batch_and_answer_in_order(proxy):
    instances = [{"n": i} for i in range(4)]
    answer = predict(proxy, {"instances": instances})
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    assert [p["echo"] for p in predictions] == instances
    assert [p["batch_size"] for p in predictions] == [4, 4, 4, 4]


def test_the_timeout_header_applies(proxy, tmp_path):
    gate = tmp_path / "gate"
    # The worker holds the instance until the client has had its answer.
    answer = predict(
        proxy, {"instances": [{"hold": str(gate)}]}, headers={"x-corral-timeout-ms": "100"}
    )
    gate.touch()
    assert answer.status_code == 408
    assert "deadline" in answer.json()["error"]


def test_readiness(proxy):
    answer = proxy.client.get("/v1/models/default")
    assert (answer.status_code, answer.json()) == (200, {"name": "default", "ready": True})


def test_an_unknown_model_is_404(proxy):
    for answer in (
        predict(proxy, {"instances": [1]}, model="nope"),
        proxy.client.get("/v1/models/nope"),
    ):
        assert answer.status_code == 404
        assert answer.json() == {"error": 'no model named "nope"'}


def test_the_models_are_listed(proxy):
    answer = proxy.client.get("/v1/models")
    assert (answer.status_code, answer.json()) == (200, {"models": ["default"]})
    assert proxy.client.post("/v1/models").status_code == 405


def test_a_path_under_v1_models_that_names_no_endpoint_is_404_in_v1_shape(proxy):
    for path in ("/v1/models/default:explain", "/v1/models/default/metadata"):
        answer = proxy.client.post(path, json={"instances": [1]})
        assert (answer.status_code, answer.json()) == (404, {"error": f"no route for {path}"})


def test_a_bad_instance_is_422_naming_it(proxy):
    answer = predict(proxy, {"instances": [1, {"invalid": "no good"}, 3]})
    assert answer.status_code == 422
    assert answer.json() == {"error": "instance 1: no good"}


@pytest.mark.parametrize("body", [{"inputs": [1]}, [1, 2], {"instances": 3}, {"instances": []}])
def test_a_body_without_instances_is_400(proxy, body):
    answer = predict(proxy, body)
    assert answer.status_code == 400
    assert "instances" in answer.json()["error"]


def test_instances_given_twice_are_400_not_the_first_taken(proxy):
    # A reader keeping the last key (Python's json, a gateway's log) would see ["ok"] while
    # the first-taken ran ["reject"]: neither is run.
    for body in [b'{"instances": [1], "instances": [2]}', b'{"instances": 3, "instances": [2]}']:
        answer = proxy.client.post(
            "/v1/models/default:predict",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == 400, answer.text
        assert "appears twice" in answer.json()["error"]


def test_v1_answers_json_whatever_accept_says_and_415_for_another_content_type(proxy):
    # README: no 406 from a client protocol; KServe v1 takes JSON (or msgpack) bodies.
    for accept in ("text/html", "application/json;q=0", "application/msgpack"):
        answer = predict(proxy, {"instances": [1]}, headers={"accept": accept})
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("application/json")
        assert len(answer.json()["predictions"]) == 1
    answer = proxy.client.post(
        "/v1/models/default:predict",
        content=b"instances=1",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 415, answer.text
    assert "error" in answer.json()
    packed = msgpack.packb({"instances": [1]})
    answer = proxy.client.post(
        "/v1/models/default:predict",
        content=packed,
        headers={"content-type": "application/msgpack"},
    )
    assert answer.status_code == 200, answer.text
    # A msgpack body that is no map is told so in words for both forms, once.
    answer = proxy.client.post(
        "/v1/models/default:predict",
        content=msgpack.packb([1, 2]),
        headers={"content-type": "application/msgpack"},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"error": 'the body must be an object with an "instances" array'}


def test_malformed_json_is_400_in_v1_shape(proxy):
    answer = proxy.client.post(
        "/v1/models/default:predict",
        content=b"{",
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert set(answer.json()) == {"error"}


def test_a_body_in_another_encoding_its_charset_names_is_415_as_on_every_route(proxy):
    # Native's alone had said so; KServe v1's 400 named neither the encoding nor UTF-8.
    headers = {"content-type": "application/json; charset=latin1"}
    answer = proxy.client.post(
        "/v1/models/default:predict", content=b'{"instances": ["caf\xe9"]}', headers=headers
    )
    assert answer.status_code == 415, answer.text
    assert "charset=latin1, but JSON is UTF-8" in answer.json()["error"]
    # UTF-8 with a NUL in a string is JSON that is not, not another encoding.
    headers = {"content-type": "application/json"}
    nul = proxy.client.post(
        "/v1/models/default:predict", content=b'{"instances": ["x\x00y"]}', headers=headers
    )
    assert nul.status_code == 400, nul.text
    assert "not UTF-8" not in nul.json()["error"] and "control character" in nul.json()["error"]


def test_the_columnar_inputs_form_is_told_not_taken(proxy):
    answer = predict(proxy, {"inputs": {"x": [1, 2]}})
    assert answer.status_code == 400
    assert 'the columnar "inputs" form is not taken' in answer.json()["error"]


def test_predict_takes_post_only(proxy):
    answer = proxy.client.get("/v1/models/default:predict")
    assert (answer.status_code, answer.headers["allow"]) == (405, "POST")


def test_a_config_route_is_its_own_model_and_readiness_waits_for_its_worker(
    corral_factory, tmp_path: Path
):
    (tmp_path / "corral.toml").write_text(
        "[stages.echo]\n"
        f'command = ["{sys.executable}", "{SCRIPTED}"]\n'
        "[stages.outside]\n"
        '[pipelines.echo]\nstages = ["echo"]\n'
        '[pipelines.outside]\nstages = ["outside"]\n'
        "[routes.echo]\n"
        'pipeline = "echo"\n'
        "[routes.outside]\n"
        'pipeline = "outside"\n'
    )
    proxy = corral_factory("--config", str(tmp_path / "corral.toml"), worker=None)
    proxy.wait_for_log(r"worker connected")
    answer = predict(proxy, {"instances": ["a"]}, model="echo")
    assert answer.json()["predictions"][0]["echo"] == "a"
    assert proxy.client.get("/v1/models/default").status_code == 404
    # No worker ever connects for the stage "outside": that model is not ready.
    answer = proxy.client.get("/v1/models/outside")
    assert (answer.status_code, answer.json()) == (503, {"name": "outside", "ready": False})


def test_64_instances_of_64_kib_from_16_clients_at_once(corral_factory):
    # Each request is a 4 MiB body of 64 rows; its batches and results are frames larger than a
    # socket buffer, and 16 clients' rows (1,024 jobs: the whole default queue) share the
    # worker at once. Default batch settings.
    from concurrent.futures import ThreadPoolExecutor

    proxy = corral_factory("--timeout-ms=120000")  # a loaded machine: about bytes, not shedding

    def one(client: int) -> tuple[int, bool]:
        instances = [{"tag": f"{client}-{i}", "blob": "x" * 65536} for i in range(64)]
        answer = predict(proxy, {"instances": instances}, timeout=60)
        if answer.status_code != 200:
            return answer.status_code, answer.text[:200]
        return 200, [p["echo"] for p in answer.json()["predictions"]] == instances

    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(one, range(16))) == [(200, True)] * 16


def test_an_output_json_cannot_carry_names_its_instance(proxy):
    """v1 answers in JSON only: an instance whose output holds NaN fails the request, and the
    message names that instance and offers no other format (v1 has none)."""
    import msgpack

    body = msgpack.packb({"instances": [1, float("nan"), 3]})
    answer = proxy.client.post(
        "/v1/models/default:predict",
        content=body,
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
    )
    assert answer.status_code == 500
    message = answer.json()["error"]
    assert message.startswith("instance 1: ") and "NaN or infinity" in message
    assert "msgpack" not in message


WORKERS = Path(__file__).parent / "workers"


def test_a_worker_with_declared_tensors_takes_instances_as_its_tensors(corral_factory):
    # Each instance reaches the worker as the row a v2 request makes ({input: tensor}); before,
    # it came as a plain list and a worker reading row["X"] failed every instance with a 500.
    proxy = corral_factory(worker=str(WORKERS / "tensor_echo.py"))  # X: FP32 [-1] -> Y = 2X
    answer = predict(proxy, {"instances": [[1, 2, 3], [4.5], {"X": [0.25]}]})
    assert answer.status_code == 200, answer.text
    # One output declared: each prediction is its value, TensorFlow Serving's row format (it
    # had been {"Y": [...]}, which a TFS client reading predictions[i] as the vector does not).
    assert answer.json() == {"predictions": [[2, 4, 6], [9], [0.5]]}
    for instances, expected in [
        ([[1], "words"], 'instance 1: input "X": '),
        ([[1], [[1, 2], [3, 4]]], 'instance 1: input "X": has shape [2, 2]; the model takes [-1]'),
        ([{"Z": [1]}], 'instance 0: unknown input "Z"; the model takes "X"'),
        ([{}], 'instance 0: missing input "X"'),
        ("DUPLICATE", 'instance 0: input "X" appears twice'),
    ]:
        if instances == "DUPLICATE":  # a key twice: JSON text, since a dict cannot hold it
            body = '{"instances": [{"X": [1], "X": [2]}]}'
            answer = proxy.client.post(
                "/v1/models/default:predict",
                content=body,
                headers={"content-type": "application/json"},
            )
        else:
            answer = predict(proxy, {"instances": instances})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"].startswith(expected), answer.text


def test_an_integer_past_64_bits_is_a_float_for_a_float_tensor_as_in_v2(corral_factory):
    # Refused as any JSON body's is ("send it as a string", which a numeric tensor refuses too),
    # though v2's JSON data takes it: an FP64 input reads it as the float it is.
    worker = str(WORKERS / "tensor_echo.py")
    proxy = corral_factory(worker=worker, env={"TENSOR_ECHO_DATATYPE": "FP64"})
    body = '{"instances": [[100000000000000000000, 1]]}'
    headers = {"content-type": "application/json"}
    answer = proxy.client.post("/v1/models/default:predict", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"predictions": [[2e20, 2]]}
    # An integer datatype still refuses it, as out of its range.
    proxy = corral_factory(worker=worker, env={"TENSOR_ECHO_DATATYPE": "INT64"})
    answer = proxy.client.post("/v1/models/default:predict", content=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith('instance 0: input "X": '), answer.text


def test_a_worker_with_several_inputs_takes_each_instance_as_a_map_of_them(corral_factory):
    proxy = corral_factory(worker=str(WORKERS / "tensors.py"))  # X FP32 [3], N INT64 [1], TEXT
    instances = [
        {"X": [1, 2, 3], "N": [2], "TEXT": ["ab"]},
        {"X": [0, 0, 1], "N": [3], "TEXT": ["c"]},
    ]
    answer = predict(proxy, {"instances": instances})
    assert answer.status_code == 200, answer.text
    first, second = answer.json()["predictions"]
    assert (first["SUM"], first["SCALED"], first["UPPER"]) == ([6], [2, 4, 6], ["AB"])
    assert (second["SCALED"], second["UPPER"]) == ([0, 0, 3], ["C"])
    for instance, expected in [
        ([1, 2, 3], 'instance 0: must be an object naming the model\'s inputs, "X", "N", "TEXT"'),
        ({"X": [1, 2, 3], "N": [2]}, 'instance 0: missing input "TEXT"'),
        ({"X": [1, 2, 3], "N": [2.5], "TEXT": ["a"]}, 'instance 0: input "N": '),
    ]:
        answer = predict(proxy, {"instances": [instance]})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"].startswith(expected), answer.text


def test_a_bytes_input_takes_tensorflow_servings_b64_form(corral_factory):
    # JSON has no bytes: {"b64": ...} is how a v1 client (TensorFlow Serving's) sends them.
    # It had been refused as "not a tensor element".
    proxy = corral_factory(worker=str(WORKERS / "tensors.py"))  # TEXT BYTES [1] -> UPPER
    instance = {"X": [1, 2, 3], "N": [2], "TEXT": [{"b64": base64.b64encode(b"ab").decode()}]}
    answer = predict(proxy, {"instances": [instance, {**instance, "TEXT": ["cd"]}]})
    assert answer.status_code == 200, answer.text
    assert [p["UPPER"] for p in answer.json()["predictions"]] == [["AB"], ["CD"]]
    bad = predict(proxy, {"instances": [{**instance, "TEXT": [{"b64": "not base64!"}]}]})
    assert bad.status_code == 400
    assert bad.json()["error"].startswith('instance 0: input "TEXT": a "b64" value that is not')
    # Bytes that are not UTF-8 come back the same way, not as an array of numbers (which read as
    # an integer tensor of another shape).
    binary = {**instance, "TEXT": [{"b64": base64.b64encode(b"\xff").decode()}]}
    answer = predict(proxy, {"instances": [binary]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"][0]["UPPER"] == [{"b64": "/w=="}]


def test_predictions_are_held_to_the_declared_outputs(corral_factory):
    # As a v2 answer is: a result that is not the declared outputs had been passed on as a
    # prediction.
    import msgpack

    from corral import _protocol as protocol
    from test_worker_protocol import FakeWorker

    sidecar = corral_factory("--max-wait-ms=0", "--retries=0", worker=None)
    spec = {"name": "X", "datatype": "FP32", "shape": [1]}
    out = {"name": "Y", "datatype": "INT64", "shape": [2]}
    worker = FakeWorker(sidecar.socket, inputs=[spec], outputs=[out])
    sidecar.wait_for_log(r"worker connected")

    def answered(result: dict):
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(predict, sidecar, {"instances": [[1.0]]})
            (job,) = worker.receive()["jobs"]
            worker.send(protocol.results([protocol.ok(job["id"], msgpack.packb(result))]))
            return answer.result(timeout=60)

    try:
        good = answered({"Y": [1, 2]})
        assert good.status_code == 200 and good.json() == {"predictions": [[1, 2]]}
        for result, problem in [
            ({"Z": [1, 2]}, 'instance 0: output "Y": missing from the worker\'s result'),
            ({"Y": [1, 2, 3]}, 'instance 0: output "Y": shape [3] where [2] is declared'),
            ({"Y": ["a", "b"]}, 'instance 0: output "Y": '),
        ]:
            bad = answered(result)
            assert bad.status_code == 500, bad.text
            assert bad.json()["error"].startswith(problem), bad.text
    finally:
        worker.close()


def test_a_worker_replacing_a_tensor_worker_alone_without_tensors_takes_plain_values(
    corral_factory,
):
    # The tensors the last worker declared had stayed: each instance still went as them.
    import msgpack

    from test_worker_protocol import FakeWorker, echo_back

    sidecar = corral_factory("--max-wait-ms=0", "--retries=0", worker=None)
    spec = {"name": "X", "datatype": "FP32", "shape": [1]}
    tensors = FakeWorker(sidecar.socket, inputs=[spec], outputs=[spec])
    sidecar.wait_for_log(r"worker connected")
    tensors.close()
    sidecar.wait_until(lambda: sidecar.metric("corral_workers_connected") == 0, what="gone")
    plain = FakeWorker(sidecar.socket)
    sidecar.wait_for_log(r"worker connected", count=2)
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(predict, sidecar, {"instances": [[1.5]]})
            batch = plain.receive()
            assert msgpack.unpackb(batch["jobs"][0]["payload"]) == [1.5], "a plain value"
            echo_back(plain, batch)
            assert answer.result(timeout=60).json() == {"predictions": [[1.5]]}
        assert sidecar.client.get("/v2/models/default").json()["inputs"] == []
    finally:
        plain.close()


def test_a_predict_before_any_worker_said_hello_is_503_not_ready(corral_factory):
    # What an instance is (a plain value, or tensors) depends on the workers' declarations: a
    # request queued before they are known reached a tensor worker as a plain list.
    proxy = corral_factory(worker=None)
    answer = predict(proxy, {"instances": [[1, 2, 3]]})
    assert answer.status_code == 503, answer.text
    assert "no worker yet" in answer.json()["error"]
    assert answer.headers["retry-after"] == "1"


def test_16_clients_of_multi_mib_instances_to_a_tensor_worker(corral_factory):
    # The conversion at the sizes users send: each request 2 instances of 262,144 values (a 2
    # MiB body, a 4 MB answer), 16 clients at once; frames far past a socket buffer, and every
    # client's rows its own.
    from concurrent.futures import ThreadPoolExecutor

    proxy = corral_factory("--timeout-ms=120000", worker=str(WORKERS / "tensor_echo.py"))
    size = 262_144

    def one(client: int) -> tuple[int, bool]:
        value = client + 0.5  # doubled exactly: 2 * client + 1
        row = "[" + ",".join([str(value)] * size) + "]"
        body = '{"instances": [' + row + ", " + row + "]}"
        answer = proxy.client.post(
            "/v1/models/default:predict",
            content=body,
            headers={"content-type": "application/json"},
            timeout=120,
        )
        if answer.status_code != 200:
            return answer.status_code, False
        predictions = answer.json()["predictions"]
        want = 2 * client + 1
        return 200, [len(p) for p in predictions] == [size, size] and all(
            p[0] == want and p[-1] == want for p in predictions
        )

    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(one, range(16))) == [(200, True)] * 16
