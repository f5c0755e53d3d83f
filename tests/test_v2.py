"""Open Inference Protocol v2 end to end, spoken by a client nobody here wrote: `tritonclient`
(HTTP) against the real binary and a real worker that declares its tensors with `corral.Tensor`
(tests/workers/tensors.py). Health, metadata, JSON and binary tensors of FP32, INT64 and BYTES,
64 rows in one request, rows of 32 clients sharing batches, and bad requests answered in v2's
own error shape without harm to the proxy."""

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from conftest import Corral
from corral import _protocol as protocol
from test_worker_protocol import FakeWorker

WORKER = str(Path(__file__).parent / "workers" / "tensors.py")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    corral = Corral(tmp_path_factory.mktemp("v2"), worker=WORKER)
    yield corral
    corral.stop()


@contextlib.contextmanager
def client(proxy) -> Iterator[triton.InferenceServerClient]:
    # Closed after use: an open client's socket, collected later, is a ResourceWarning (an
    # error here) in whichever test happens to be running then.
    c = triton.InferenceServerClient(proxy.url.removeprefix("http://"), concurrency=1)
    try:
        yield c
    finally:
        c.close()


def rows(n: int, text: bytes = b"abc"):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) / 4
    scale = np.arange(1, n + 1, dtype=np.int64).reshape(n, 1)
    words = np.array([[text + str(i).encode()] for i in range(n)], dtype=object)
    return x, scale, words


def tensors(x, scale, words, binary: bool = True) -> list[triton.InferInput]:
    """The worker's three inputs for tritonclient, holding `x`, `scale` and `words`."""
    inputs = [
        triton.InferInput("X", list(x.shape), "FP32"),
        triton.InferInput("N", list(scale.shape), "INT64"),
        triton.InferInput("TEXT", list(words.shape), "BYTES"),
    ]
    for tensor, data in zip(inputs, (x, scale, words)):
        tensor.set_data_from_numpy(data, binary_data=binary)
    return inputs


def infer(proxy, x, scale, words, binary: bool, outputs=("SUM", "SCALED", "UPPER", "BATCH")):
    inputs = tensors(x, scale, words, binary)
    requested = [triton.InferRequestedOutput(name, binary_data=binary) for name in outputs]
    with client(proxy) as c:
        return c.infer("default", inputs, outputs=requested)


def test_health_and_metadata(proxy):
    with client(proxy) as c:
        assert c.is_server_live()
        assert c.is_server_ready()
        assert c.is_model_ready("default")
        assert not c.is_model_ready("nope")
        assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
        metadata = c.get_model_metadata("default")
        assert metadata["name"] == "default"
        assert metadata["inputs"] == [
            {"name": "X", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "N", "datatype": "INT64", "shape": [-1, 1]},
            {"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]},
        ]
        assert [o["name"] for o in metadata["outputs"]] == ["SUM", "SCALED", "UPPER", "BATCH"]
        # A version in the path is accepted and ignored: a route is one version of its model.
        assert proxy.client.get("/v2/models/default/versions/1/ready").status_code == 200
        versioned = proxy.client.get("/v2/models/default/versions/7").json()
        assert versioned["inputs"] == metadata["inputs"]


def test_model_config_in_triton_s_form(proxy):
    # What Triton's own examples read: the tensors without the batch
    # dimension, Triton's type names, and the batch bound a request may fill.
    with client(proxy) as c:
        assert "model_configuration" in c.get_server_metadata()["extensions"]
        config = c.get_model_config("default")
    assert config["name"] == "default"
    assert config["max_batch_size"] == 32  # the proxy's default --max-batch-size
    assert config["input"] == [
        {"name": "X", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [3]},
        {"name": "N", "data_type": "TYPE_INT64", "format": "FORMAT_NONE", "dims": [1]},
        {"name": "TEXT", "data_type": "TYPE_STRING", "format": "FORMAT_NONE", "dims": [1]},
    ]
    assert [o["name"] for o in config["output"]] == ["SUM", "SCALED", "UPPER", "BATCH"]
    assert all(set(o) == {"name", "data_type", "dims"} for o in config["output"])
    with client(proxy) as c, pytest.raises(InferenceServerException) as unknown:
        c.get_model_config("nope")
    assert unknown.value.status() == "404"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_fp32_int64_and_bytes_tensors(proxy, binary):
    x, scale, words = rows(2)
    result = infer(proxy, x, scale, words, binary)
    assert result.as_numpy("SUM").dtype == np.float32
    np.testing.assert_allclose(result.as_numpy("SUM"), x.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(result.as_numpy("SCALED"), x * scale)
    # As from Triton: BYTES come back as bytes from binary data, as str from JSON.
    upper = [
        [v.encode() if isinstance(v, str) else v for v in row] for row in result.as_numpy("UPPER")
    ]
    assert upper == [[b"ABC0"], [b"ABC1"]]
    batch = result.as_numpy("BATCH")
    assert batch.dtype == np.int64 and batch.shape == (2, 2)


def test_only_the_outputs_asked_for_come_back(proxy):
    x, scale, words = rows(1)
    result = infer(proxy, x, scale, words, True, outputs=("SUM",))
    np.testing.assert_allclose(result.as_numpy("SUM"), x.sum(axis=1, keepdims=True))
    assert result.as_numpy("SCALED") is None


def test_classification_is_refused_not_answered_with_the_raw_tensor(proxy):
    # Triton's classification extension: Corral does not serve it (GET /v2 lists what it does),
    # and a client asking for classes was given the raw tensor with a 200.
    x, scale, words = rows(1)
    with client(proxy) as c, pytest.raises(InferenceServerException) as refused:
        c.infer(
            "default",
            tensors(x, scale, words),
            outputs=[triton.InferRequestedOutput("SUM", class_count=1)],
        )
    assert refused.value.status() == "400"
    assert 'output "SUM" asks for classification' in str(refused.value)


def test_a_sequence_is_refused_not_spread_over_workers_unseen(proxy):
    # Triton's sequence batching keeps a stateful model's requests on one instance, in order;
    # Corral batches each request on its own, and had answered a sequence's requests 200.
    x, scale, words = rows(1)
    with client(proxy) as c:
        with pytest.raises(InferenceServerException) as refused:
            c.infer("default", tensors(x, scale, words), sequence_id=5, sequence_start=True)
        assert refused.value.status() == "400"
        assert "names a sequence (sequence_id)" in str(refused.value)
        # tritonclient's default, sequence_id=0, sends no sequence at all (a smoke test; the
        # proxy's own reading of 0 and "" is posted below).
        result = c.infer("default", tensors(x, scale, words), sequence_id=0)
        np.testing.assert_allclose(result.as_numpy("SUM"), x.sum(axis=1, keepdims=True))
    for no_sequence in (0, ""):
        header = good()
        header["parameters"] = {"sequence_id": no_sequence}
        assert post(proxy, INFER, header).status_code == 200
    header = good()
    header["parameters"] = {"sequence_id": "session-7", "sequence_end": True}
    answer = post(proxy, INFER, header)
    assert answer.status_code == 400 and "names a sequence" in answer.json()["error"]


def test_tritons_shared_memory_is_refused_naming_the_extension(proxy):
    # An input in a region came with no data ("has neither data nor binary_data_size"), and an
    # output asked for in one was written in the body, where its client does not look.
    x, scale, words = rows(1)
    inputs = tensors(x, scale, words)
    inputs[0].set_shared_memory("input_region", x.nbytes)
    with client(proxy) as c, pytest.raises(InferenceServerException) as refused:
        c.infer("default", inputs)
    assert refused.value.status() == "400"
    assert 'input "X": names a shared-memory region' in str(refused.value)
    output = triton.InferRequestedOutput("SUM")
    output.set_shared_memory("output_region", 4)
    with client(proxy) as c, pytest.raises(InferenceServerException) as refused:
        c.infer("default", tensors(x, scale, words), outputs=[output])
    assert refused.value.status() == "400"
    assert 'output "SUM": names a shared-memory region' in str(refused.value)


def test_tritons_timeout_parameter_is_the_requests_deadline(tmp_path):
    # tritonclient's `timeout=` (microseconds) had been ignored: the request waited out the
    # proxy's own timeout (here 5 min; the client gives up after 30 s). The worker holds every
    # batch until the test opens the gate.
    gate = tmp_path / "gate"
    proxy = Corral(
        tmp_path, "--timeout-ms", "300000", worker=WORKER, env={"TENSORS_GATE": str(gate)}
    )
    try:
        x, scale, words = rows(2)
        address = proxy.url.removeprefix("http://")
        c = triton.InferenceServerClient(address, concurrency=1, network_timeout=30.0)
        with contextlib.closing(c), pytest.raises(InferenceServerException) as expired:
            c.infer("default", tensors(x, scale, words), timeout=50_000)
        assert expired.value.status() == "408"
        gate.touch()
        with client(proxy) as c:
            answer = c.infer("default", tensors(x, scale, words), timeout=0)  # 0: none
        np.testing.assert_allclose(answer.as_numpy("SCALED"), x * scale)
    finally:
        proxy.stop()


def test_a_short_triton_timeout_on_an_idle_stage_is_served(proxy):
    # The parameter shortened the deadline but not the request's whole time: admission kept 5%
    # of the route's 5 s (250 ms) as its margin, and refused every 200 ms timeout (38 of 40),
    # which the same deadline as a header got served.
    x, scale, words = rows(1)
    with client(proxy) as c:
        c.infer("default", tensors(x, scale, words))  # the stage learns what a batch costs
        for _ in range(5):
            answer = c.infer("default", tensors(x, scale, words), timeout=200_000)
            np.testing.assert_allclose(answer.as_numpy("SCALED"), x * scale)


def test_a_request_of_64_rows_is_64_jobs_in_order(proxy):
    x, scale, words = rows(64)
    result = infer(proxy, x, scale, words, True)
    np.testing.assert_allclose(result.as_numpy("SCALED"), x * scale)
    assert result.as_numpy("UPPER")[63, 0] == b"ABC63"
    # Every row was a job; the 64 went in batches of at most the default 32.
    sizes = {tuple(b) for b in result.as_numpy("BATCH").tolist()}
    assert sum(size for _, size in sizes) == 64


def test_rows_of_32_clients_share_batches(tmp_path):
    gate = tmp_path / "gate"
    proxy = Corral(tmp_path, worker=WORKER, env={"TENSORS_GATE": str(gate)})
    try:
        clients = 32
        barrier = threading.Barrier(clients)

        def one(i):
            x, scale, words = rows(1, text=b"client%d-" % i)
            barrier.wait()
            return infer(proxy, x, scale, words, binary=True)

        with ThreadPoolExecutor(clients) as pool:
            futures = [pool.submit(one, i) for i in range(clients)]
            # The worker holds its first batch at the gate; the others' rows queue meanwhile.
            proxy.wait_until(
                lambda: proxy.metric("corral_queue_depth", stage="default") >= clients // 2,
                what="rows queued behind the gated batch",
            )
            gate.touch()
            results = [f.result() for f in futures]
        batch_of = [tuple(r.as_numpy("BATCH")[0]) for r in results]
        shared = [b for b in set(batch_of) if batch_of.count(b) > 1]
        assert shared, f"no two clients' rows shared a batch: {batch_of}"
        for number, size in shared:
            assert batch_of.count((number, size)) == size, "a batch's size counts its rows"
    finally:
        proxy.stop()


def test_a_rejected_row_fails_the_request_naming_it(proxy):
    x, scale, _ = rows(3)
    words = np.array([[b"fine"], [b"reject"], [b"fine"]], dtype=object)
    with pytest.raises(InferenceServerException) as failed:
        infer(proxy, x, scale, words, True)
    assert "row 1: this row is rejected" in str(failed.value)
    assert failed.value.status() == "422"


def test_a_native_client_of_a_tensor_worker_is_read_as_a_v2_row(proxy):
    """The native route sends a payload as it was sent: the package reads one naming the
    declared inputs as a v2 row (each value its input's datatype and shape), where the worker's
    `forward` had got lists (500) and a wrong shape had been the model's 500 too."""
    row = {"X": [1, 2, 3], "N": [2], "TEXT": ["abc"]}
    ok = proxy.client.post("/infer", json=row)
    assert ok.status_code == 200, ok.text
    answer = ok.json()
    assert (answer["SUM"], answer["SCALED"], answer["UPPER"]) == ([6.0], [2.0, 4.0, 6.0], ["ABC"])


def test_a_native_row_that_cannot_be_its_tensors_is_the_item_s_422(corral_factory):
    # tests/workers/tensor_echo.py has no preprocess of its own: the row is refused, naming why
    # (it had been the model's 500), and its batch-mate is served.
    from pathlib import Path

    proxy = corral_factory(worker=str(Path(__file__).parent / "workers" / "tensor_echo.py"))
    items = [{"X": [1, 2]}, {"X": ["a"]}]
    many = proxy.client.post("/infer", json=items, headers={"x-corral-items": "many"})
    assert many.status_code == 422, many.text
    (failed,) = many.json()["items"]
    assert failed["index"] == 1 and "input 'X' cannot be a tensor of FP32" in failed["message"]
    assert proxy.client.post("/infer", json=items[0]).json() == {"Y": [2.0, 4.0]}


def post(proxy, path, header, binary=b"", **kwargs):
    body = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(body))} if binary else {}
    return proxy.client.post(path, content=body + binary, headers=headers, **kwargs)


INFER = "/v2/models/default/infer"


def good():
    return {
        "inputs": [
            {"name": "X", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
            {"name": "N", "shape": [1, 1], "datatype": "INT64", "data": [2]},
            {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]},
        ]
    }


@pytest.mark.parametrize(
    "case, status, expected",
    [
        ("wrong datatype", 400, 'input "X" is FP64; the model takes FP32'),
        ("shape mismatch", 400, 'input "X" has shape [1, 4]'),
        ("missing input", 400, 'missing input "TEXT"'),
        ("binary past the body", 400, "runs past the body"),
        ("unknown output", 400, 'unknown output "NOPE"'),
        # Was a 200 listing SUM twice, where an input given twice is a 400.
        ("output asked for twice", 400, 'output "SUM" is asked for twice'),
        ("not JSON", 400, "the inference request is not valid"),
        ("unknown model", 404, 'no model named "nope"'),
    ],
)
def test_bad_requests_get_a_v2_error_and_harm_nothing(proxy, case, status, expected):
    header, binary, path = good(), b"", INFER
    if case == "wrong datatype":
        header["inputs"][0]["datatype"] = "FP64"
    elif case == "shape mismatch":
        header["inputs"][0].update(shape=[1, 4], data=[1, 2, 3, 4])
    elif case == "missing input":
        header["inputs"].pop()
    elif case == "binary past the body":
        del header["inputs"][0]["data"]
        header["inputs"][0]["parameters"] = {"binary_data_size": 12}
        binary = b"\0" * 8
    elif case == "unknown output":
        header["outputs"] = [{"name": "NOPE"}]
    elif case == "output asked for twice":
        header["outputs"] = [{"name": "SUM"}, {"name": "SUM", "parameters": {"binary_data": True}}]
    elif case == "unknown model":
        path = "/v2/models/nope/infer"
    if case == "not JSON":
        answer = proxy.client.post(path, content=b"{nope")
    else:
        answer = post(proxy, path, header, binary)
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert list(body) == ["error"] and expected in body["error"], body
    # The proxy is unharmed: a good request right after is answered.
    again = post(proxy, INFER, good())
    assert again.status_code == 200, again.text
    assert again.json()["outputs"][0] == {
        "name": "SUM",
        "datatype": "FP32",
        "shape": [1, 1],
        "data": [6.0],
    }


def test_nan_and_infinity_come_back_in_binary_and_are_refused_as_json(proxy):
    x, scale, words = rows(2)
    x[1] = [np.inf, -np.inf, np.nan]
    inputs = tensors(x, scale, words)  # binary: JSON could not carry them in either
    with client(proxy) as c:
        answer = c.infer("default", inputs, outputs=[triton.InferRequestedOutput("SCALED")])
        scaled = answer.as_numpy("SCALED")[1]
        assert list(scaled[:2]) == [np.inf, -np.inf] and np.isnan(scaled[2])
        # JSON has no such numbers: written as null, tritonclient would read NaN for +inf.
        with pytest.raises(InferenceServerException) as failed:
            as_json = triton.InferRequestedOutput("SCALED", binary_data=False)
            c.infer("default", inputs, outputs=[as_json])
    assert failed.value.status() == "500"
    assert "is not a number JSON can carry: ask for it with binary_data" in str(failed.value)
    # Named by its row, as every failed row is (it was not).
    assert 'row 1, output "SCALED": inf is not a number' in str(failed.value)


@pytest.mark.parametrize(
    "headers",
    [
        {"accept": "text/html"},
        {"accept": "application/json;q=0"},
        {"content-type": "application/x-www-form-urlencoded"},
        {"content-type": "text/plain", "accept": "application/msgpack"},
    ],
)
def test_a_v2_request_is_read_and_answered_in_v2_form_whatever_its_media_types(proxy, headers):
    # README: the client protocols answer in their own form whatever Accept says (no 406), and
    # v2 reads its body whatever Content-Type names (Triton's clients differ in what they send).
    answer = proxy.client.post(INFER, content=json.dumps(good()).encode(), headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert {o["name"] for o in answer.json()["outputs"]} >= {"SUM", "SCALED"}


def test_a_byte_order_mark_is_named_not_taken_for_a_header_that_is_no_object(proxy):
    body = b"\xef\xbb\xbf" + json.dumps(good()).encode()
    answer = proxy.client.post(INFER, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert "request begins with a byte order mark" in answer.json()["error"]


def test_a_v2_body_that_is_neither_json_nor_its_binary_form_is_400(proxy):
    answer = proxy.client.post(
        INFER, content=b"\x81\xa1a\x01", headers={"content-type": "application/msgpack"}
    )
    assert answer.status_code == 400, answer.text
    assert set(answer.json()) == {"error"}


def test_a_number_past_fp32_is_400_as_an_integer_too_large_is(proxy):
    header = good()
    header["inputs"][0]["data"] = [1, 2, 1e39]
    answer = post(proxy, INFER, header)
    assert answer.status_code == 400
    assert answer.json() == {"error": 'input "X": element 2: 1e39 does not fit in FP32'}


def test_a_nan_sent_as_json_is_told_to_go_as_binary_data(proxy):
    # tritonclient writes a NaN bare with binary_data=False: the 400 had been serde's
    # "expected value at line 1 column 64", calling the JSON body a "header".
    x, scale, words = rows(1)
    x[0][1] = np.nan
    inputs = tensors(x, scale, words, binary=False)
    with client(proxy) as c, pytest.raises(InferenceServerException) as failed:
        c.infer("default", inputs)
    assert failed.value.status() == "400"
    assert "the inference request is not valid" in str(failed.value)
    assert "JSON has no NaN or Infinity: send such a tensor as binary data" in str(failed.value)


def test_a_body_in_another_encoding_its_charset_names_is_415_in_v2_shape(proxy):
    body = b'{"id": "caf\xe9", ' + json.dumps(good())[1:].encode()
    named = {"content-type": "application/json; charset=latin1"}
    answer = proxy.client.post(INFER, content=body, headers=named)
    assert answer.status_code == 415, answer.text
    assert list(answer.json()) == ["error"]
    assert "charset=latin1, but JSON is UTF-8" in answer.json()["error"]
    plain = proxy.client.post(INFER, content=body, headers={"content-type": "application/json"})
    assert plain.status_code == 400, plain.text
    assert "it is not UTF-8, which JSON is" in plain.json()["error"]
    # In `parameters`, which v2 does not read, too (it had been served).
    unread = b'{"parameters": {"note": "caf\xe9"}, ' + json.dumps(good())[1:].encode()
    answer = proxy.client.post(INFER, content=unread, headers=named)
    assert answer.status_code == 415, answer.text


def test_a_compressed_body_is_415_in_v2_shape(proxy):
    x, scale, words = rows(1)
    inputs = tensors(x, scale, words)
    with client(proxy) as c, pytest.raises(InferenceServerException) as failed:
        c.infer("default", inputs, request_compression_algorithm="gzip")
    assert failed.value.status() == "415"
    assert 'Content-Encoding "gzip" is not supported' in str(failed.value)


def test_a_path_under_v2_that_names_no_endpoint_is_404_in_v2_shape(proxy):
    for path in (
        "/v2/repository/models/default/load",
        "/v2/models/default/statistics",
        "/v2/models/default/x",
    ):
        answer = proxy.client.get(path)
        assert (answer.status_code, answer.json()) == (404, {"error": f"no route for {path}"})


def test_the_repository_index_lists_each_model_and_its_state(proxy, corral_factory):
    with client(proxy) as c:
        assert "model_repository" in c.get_server_metadata()["extensions"]
        ready = [{"name": "default", "version": "1", "state": "READY"}]
        assert c.get_model_repository_index() == ready
    assert proxy.client.post("/v2/repository/index", json={"ready": True}).json() == ready
    # A model whose stage has no worker yet is unavailable, saying why; asked for the ready
    # ones only, it is left out.
    idle = corral_factory(worker=None)
    (model,) = idle.client.post("/v2/repository/index").json()
    assert (model["name"], model["state"]) == ("default", "UNAVAILABLE")
    assert "no connected worker" in model["reason"], model
    assert idle.client.post("/v2/repository/index", json={"ready": True}).json() == []
    bad = idle.client.post("/v2/repository/index", content=b'{"ready": 1}')
    assert (bad.status_code, bad.json()) == (400, {"error": '"ready" must be true or false'})
    not_an_object = idle.client.post("/v2/repository/index", content=b"[1, 2]")
    assert not_an_object.status_code == 400, not_an_object.text
    # It had said "the body is a JSON object", the opposite of the problem.
    assert not_an_object.json()["error"].startswith("the body must be a JSON object")
    # Declared over 4 KiB: refused before a byte of it is sent (none is, here).
    host, port = idle.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as conn:
        conn.sendall(
            b"POST /v2/repository/index HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n"
        )
        assert conn.recv(65536).startswith(b"HTTP/1.1 413")
    # Sent chunked, with no length to refuse it by: refused as it passes 4 KiB.
    chunks = (b"{" + b" " * 1024 for _ in range(8))
    large = idle.client.post("/v2/repository/index", content=chunks)
    assert large.status_code == 413, large.text
    gzipped = {"content-encoding": "gzip", "connection": "close"}
    compressed = idle.client.post("/v2/repository/index", content=b"x", headers=gzipped)
    assert compressed.status_code == 415 and compressed.headers["accept-encoding"] == "identity"
    # tritonclient's load_model and unload_model: workers load models, not the proxy.
    for verb in ("load", "unload"):
        path = f"/v2/repository/models/default/{verb}"
        answer = idle.client.post(path, json={})
        assert (answer.status_code, answer.json()) == (404, {"error": f"no route for {path}"})
    answer = idle.client.get("/v2/repository/index")
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"


def test_a_model_name_that_needs_escaping_is_found(corral_factory, tmp_path):
    # tritonclient quotes the name into the path: the proxy reads it percent-decoded.
    name = "résumé model@1"
    (tmp_path / "corral.toml").write_text(
        f'[stages.s]\ncommand = ["{sys.executable}", "{WORKER}"]\n'
        f'[pipelines.p]\nstages = ["s"]\n[routes."{name}"]\npipeline = "p"\npath = "/resume"\n'
    )
    proxy = corral_factory("--config", str(tmp_path / "corral.toml"), worker=None)
    proxy.wait_for_log(r"worker connected")
    x, scale, words = rows(1)
    with client(proxy) as c:
        assert c.is_model_ready(name)
        assert c.get_model_metadata(name)["name"] == name
    inputs = tensors(x, scale, words)
    with client(proxy) as c:
        answer = c.infer(name, inputs, outputs=[triton.InferRequestedOutput("SUM")])
    assert answer.as_numpy("SUM").tolist() == [[x.sum()]]
    assert answer.get_response()["model_name"] == name
    # KServe v1 reads it the same way.
    quoted = "r%C3%A9sum%C3%A9%20model%401"
    answer = proxy.client.get(f"/v1/models/{quoted}")
    assert (answer.status_code, answer.json()) == (200, {"name": name, "ready": True})


def test_model_config_says_the_batch_the_workers_take(corral_factory):
    # A worker taking 4 a batch: a client sizing requests by 32 had made 8 batches a request.
    # A scalar a row is dims [] (a client building [batch] + dims sends what infer takes).
    sidecar = corral_factory(worker=None)
    scalar = {"name": "S", "datatype": "FP32", "shape": []}
    worker = FakeWorker(sidecar.socket, max_batch=4, inputs=[scalar], outputs=[scalar])
    try:
        sidecar.wait_for_log(r"worker connected")
        with client(sidecar) as c:
            config = c.get_model_config("default")
    finally:
        worker.close()
    assert config["max_batch_size"] == 4
    assert config["input"] == [
        {"name": "S", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": []}
    ]


def test_metadata_before_any_worker_connected_is_503_not_an_empty_model(corral_factory, tmp_path):
    # Empty tensor lists would say the model has none, and a client may cache that.
    (tmp_path / "corral.toml").write_text(
        '[stages.outside]\n[pipelines.p]\nstages = ["outside"]\n[routes.m]\npipeline = "p"\n'
    )
    proxy = corral_factory("--config", str(tmp_path / "corral.toml"), worker=None)
    for path in ("/v2/models/m", "/v2/models/m/config"):
        answer = proxy.client.get(path)
        assert answer.status_code == 503
        assert answer.json() == {
            "error": 'model "m" has no metadata yet: its workers declare its tensors when they '
            "connect"
        }


def test_an_infer_before_any_worker_connected_is_503_not_queued_unchecked(corral_factory):
    # Queued while the model loaded, no input was checked: one of the wrong shape failed its
    # batch-mates' rows, one of the wrong datatype was served. KServe v1 answered 503 already.
    from test_worker_protocol import FakeWorker

    proxy = corral_factory("--retries=0", worker=None)
    body = {"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    answer = proxy.client.post(INFER, json=body)
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "1"
    assert "has no metadata yet" in answer.json()["error"]
    # Once a worker has connected, declaring nothing, the stage takes plain rows, and still
    # does while that worker restarts: its requests wait for it.
    worker = FakeWorker(proxy.socket)
    proxy.wait_for_log(r"worker connected")
    worker.close()
    proxy.wait_until(lambda: proxy.metric("corral_workers_connected", stage="default") == 0,
                     what="the worker gone")  # fmt: skip
    waiting = proxy.client.post(INFER, json=body, headers={"x-corral-timeout-ms": "300"})
    assert waiting.status_code == 408, waiting.text
    # KServe v1 alike (it had answered 503 while a plain worker restarted).
    instances = {"instances": [[1, 2, 3]]}
    predict = "/v1/models/default:predict"
    v1 = proxy.client.post(predict, json=instances, headers={"x-corral-timeout-ms": "300"})
    assert v1.status_code == 408, v1.text


def test_an_infer_that_is_not_a_post_is_405(proxy):
    answer = proxy.client.get(INFER)
    assert answer.status_code == 405
    assert "error" in answer.json()


def test_small_requests_of_many_rows_are_refused_before_they_are_built(corral_factory):
    """A route whose worker declared nothing: a few bytes may describe millions of empty rows,
    or repeat a long name in each row; both are refused before any row exists."""
    proxy = corral_factory()
    empty_rows = {
        "inputs": [{"name": "X", "shape": [100_000_000, 0], "datatype": "FP32", "data": []}]
    }
    answer = post(proxy, INFER, empty_rows)
    assert answer.status_code == 413 and "100000000" in answer.json()["error"], answer.text
    long_name = {
        "inputs": [
            {"name": "X" * 100_000, "shape": [1000, 1], "datatype": "UINT8", "data": [0] * 1000}
        ]
    }
    answer = post(proxy, INFER, long_name)
    assert answer.status_code == 413 and "4x its body" in answer.json()["error"], answer.text
    assert proxy.post({"x": 1}).status_code == 200, "the proxy is unharmed"


@pytest.mark.parametrize(
    "rows, width, clients, memory, binary",
    [
        (64, 16_384, 16, None, True),
        (1, 1_048_576, 16, None, True),
        # Room in the shared memory for two requests of 64: the rest find it full, and their
        # rows, not gathered, go in the frames beside rows that were.
        (64, 16_384, 64, 8 * 1024 * 1024, True),
        (1, 1_048_576, 64, 8 * 1024 * 1024, True),
        # As JSON both ways (about 800 KB of text a request): `data` packed as the header is
        # read, the answer's FP32 written as float32, which must read back to the same values.
        (4, 16_384, 64, None, False),
    ],
)
def test_multi_mib_binary_tensors_from_many_clients(
    corral_factory, rows, width, clients, memory, binary
):
    # Clients at once, each 4 MiB a request: 64 rows of 16,384 FP32 (64 KiB a row, each
    # gathered into shared memory), or one row of 1,048,576 (read in one piece of its body):
    # rows of several clients share batches, and every value comes back right.
    # A deadline far beyond the work: on a loaded machine the 5 s default can be predicted
    # unreachable (a 503), and this test is about the bytes, not about shedding.
    worker = str(Path(__file__).parent / "workers" / "tensor_echo.py")
    sizing = [] if memory is None else [f"--shared-memory-bytes={memory}"]
    # Room in the queue for every row at once (64 clients of 64 rows): about the bytes, again.
    proxy = corral_factory("--timeout-ms=120000", "--queue-capacity=8192", *sizing, worker=worker)

    def one(i):
        x = np.random.default_rng(i).random((rows, width), dtype=np.float32)
        tensor = triton.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        wanted = [triton.InferRequestedOutput("Y", binary_data=binary)]
        with client(proxy) as c:
            y = c.infer("default", [tensor], outputs=wanted).as_numpy("Y")
        return y.dtype == np.float32 and np.array_equal(y, x * 2)

    with ThreadPoolExecutor(clients) as pool:
        assert list(pool.map(one, range(clients))) == [True] * clients
    if memory is not None:
        assert proxy.metric("corral_shared_memory_full_total") > 0, "some found it full"
    proxy.wait_until(
        lambda: proxy.metric("corral_shared_memory_used_bytes") == 0, what="memory given back"
    )


def test_json_numbers_pack_as_the_nearest_float16(corral_factory):
    # Rounded to float32 first and then to float16, each was one step off (2049.0000001 became
    # 2048, not 2050). (65519.999, which is 65504, was refused as too large: a unit test has it,
    # as an answer doubled here would be past FP16's range.)
    worker = str(Path(__file__).parent / "workers" / "tensor_echo.py")
    proxy = corral_factory(worker=worker, env={"TENSOR_ECHO_DATATYPE": "FP16"})
    sent = [2049.0000001, 1.0004882821813226, 0.50024414062501, -2049.0000001]
    body = {"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP16", "data": sent}]}
    answer = proxy.client.post("/v2/models/default/infer", json=body)
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    nearest = np.array([2050, 1 + 2**-10, 0.5 + 2**-11, -2050], np.float16)
    assert output["datatype"] == "FP16"
    assert np.array_equal(np.array(output["data"], np.float16), nearest * 2)


def answered_by(sidecar, worker, pool, body, data: bytes):
    """The answer to one v2 request of one row on `sidecar`, whose fake `worker` answers that
    row's job `data`."""
    answer = pool.submit(sidecar.client.post, "/v2/models/default/infer", json=body)
    (job,) = worker.receive()["jobs"]
    worker.send(protocol.results([protocol.ok(job["id"], data)]))
    return answer.result(timeout=60)


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        # {"y": 1, "y": 2}: was a 200 listing output "y" twice.
        (b"\x82\xa1y\x01\xa1y\x02", 'row 0, output "y": named twice in the worker\'s result'),
        # {1: 2}: was a 200 with no outputs at all.
        (b"\x81\x01\x02", "row 0: the worker's result has a key that is no output name"),
        # [{"y": 1}]: a streaming worker's one-shot answer (its chunks) was told only that a
        # result must be a map, though it had sent maps.
        (b"\x91\x81\xa1y\x01", "not an array (a streaming worker answers with its chunks"),
    ],
)
def test_a_result_v2_cannot_answer_from_a_worker_that_declares_no_outputs_is_a_500(
    corral_factory, result, problem
):
    """The worker declares no tensors, so its result's keys are the outputs: a key repeated (a
    msgpack map may repeat one) or a key that is not a name fails the request, 500 in v2's shape,
    and the worker keeps its connection."""
    sidecar = corral_factory("--max-wait-ms=0", "--retries=0", worker=None)
    worker = FakeWorker(sidecar.socket)
    sidecar.wait_for_log(r"worker connected")
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    try:
        with ThreadPoolExecutor(1) as pool:
            failed = answered_by(sidecar, worker, pool, body, result)
            served = answered_by(sidecar, worker, pool, body, b"\x81\xa1y\x03")  # {"y": 3}
    finally:
        worker.close()
    assert failed.status_code == 500, failed.text
    assert set(failed.json()) == {"error"} and problem in failed.json()["error"], failed.text
    assert served.status_code == 200, served.text
    assert served.json()["outputs"] == [
        {"name": "y", "datatype": "INT64", "shape": [1], "data": [3]}
    ]


def test_twenty_thousand_inputs_and_outputs_of_a_worker_that_declares_none(corral_factory):
    """At the sizes an echoing worker meets: 20,000 inputs in, a result of 20,000 keys back, as
    every output and asked for by name (each was a scan of every key per name: quadratic), and
    the same inputs with one given twice, a 400."""
    import msgpack

    sidecar = corral_factory("--max-wait-ms=0", "--retries=0", "--timeout-ms=60000", worker=None)
    worker = FakeWorker(sidecar.socket)
    sidecar.wait_for_log(r"worker connected")
    count = 20_000
    inputs = [
        {"name": f"k{i}", "shape": [1], "datatype": "INT64", "data": [i]} for i in range(count)
    ]
    result = msgpack.packb({f"k{i}": i for i in range(count)})
    try:
        with ThreadPoolExecutor(1) as pool:
            every = answered_by(sidecar, worker, pool, {"inputs": inputs}, result)
            named = [{"name": f"k{i}"} for i in reversed(range(count))]
            body = {"inputs": inputs, "outputs": named}
            by_name = answered_by(sidecar, worker, pool, body, result)
    finally:
        worker.close()
    for response, order in ((every, range(count)), (by_name, range(count - 1, -1, -1))):
        assert response.status_code == 200, response.text[:300]
        outputs = response.json()["outputs"]
        assert [o["name"] for o in outputs] == [f"k{i}" for i in order]
        assert [o["data"] for o in outputs] == [[i] for i in order]
    twice = sidecar.client.post("/v2/models/default/infer", json={"inputs": [*inputs, inputs[7]]})
    assert twice.status_code == 400 and "appears twice" in twice.json()["error"], twice.text


def test_v2_readiness_is_503_until_a_worker_connects(corral_factory):
    # ARCHITECTURE: not ready is 503 on every health route (the spec says a 4xx; tritonclient
    # reads only 200 as ready).
    proxy = corral_factory(worker=None)
    for path in ("/v2/health/ready", "/v2/models/default/ready"):
        assert proxy.client.get(path).status_code == 503, path
    with client(proxy) as c:
        assert not c.is_server_ready()
    assert proxy.client.get("/v2/health/live").status_code == 200


def test_a_typed_worker_serves_v2_clients(corral_factory):
    """examples/typed declares a msgspec `Vector` of `values: list[float]`: a v2 row arrives as
    a tensor value, which the typed decoder refused (every v2 request was a 422). It now takes
    the row as lists; the type's own limits still answer 422 in v2's shape."""
    typed = str(Path(__file__).parents[1] / "examples" / "typed" / "worker.py")
    proxy = corral_factory(worker=typed)
    for binary in (False, True):
        values = triton.InferInput("values", [2, 2], "FP32")
        values.set_data_from_numpy(np.array([[3, 4], [6, 8]], dtype=np.float32), binary)
        with client(proxy) as c:
            answer = c.infer("default", [values])
        assert answer.as_numpy("norm").tolist() == [5.0, 10.0]
        assert answer.as_numpy("size").tolist() == [2, 2]
    too_long = triton.InferInput("values", [1, 1025], "FP32")
    too_long.set_data_from_numpy(np.zeros((1, 1025), dtype=np.float32))
    with client(proxy) as c, pytest.raises(InferenceServerException) as refused:
        c.infer("default", [too_long])
    assert "row 0" in str(refused.value) and "1024" in str(refused.value)


def test_a_bool_tensor_of_bytes_other_than_0_or_1_is_the_clients_400(corral_factory):
    """It reached the worker, whose package refused the row: a 422, "the model rejected this
    row", for a malformed request."""
    echo = str(Path(__file__).parent.parent / "examples" / "echo" / "worker.py")
    proxy = corral_factory(worker=echo)  # no declarations: the proxy alone checks
    header = {"inputs": [{"name": "B", "shape": [1, 2], "datatype": "BOOL",
                          "parameters": {"binary_data_size": 2}}]}  # fmt: skip
    refused = post(proxy, INFER, header, b"\x01\x02")
    assert refused.status_code == 400, refused.text
    assert "a BOOL tensor's bytes must each be 0 or 1" in refused.json()["error"]
    fine = post(proxy, INFER, header, b"\x01\x00")
    assert fine.status_code == 200, fine.text
    assert fine.json()["outputs"][0]["data"] == [True, False]


def test_a_worker_without_declarations_echoes_uint64_rows_past_int64s_range(corral_factory):
    """Integers came back as INT64, each row on its own: a value of 2**63 or more was a 500,
    and so were rows whose values suggested different datatypes ("rows must agree"). 100 rows
    a request (spread over batches of 32), 16 clients at once."""
    echo = str(Path(__file__).parent.parent / "examples" / "echo" / "worker.py")
    proxy = corral_factory("--queue-capacity=4096", worker=echo)  # 1,600 rows queued at most
    values = [[i] for i in range(99)] + [[2**64 - 1]]
    header = {"inputs": [{"name": "B", "shape": [100, 1], "datatype": "UINT64",
                          "data": values}]}  # fmt: skip
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: post(proxy, INFER, header), range(16)))
    for answer in answers:
        assert answer.status_code == 200, answer.text
        (output,) = answer.json()["outputs"]
        assert (output["datatype"], output["shape"]) == ("UINT64", [100, 1])
        assert output["data"] == [v for row in values for v in row]


def test_a_row_past_one_frame_is_a_413_in_v2_terms(corral_factory):
    """A row whose payload would not fit the worker protocol's 64 MiB frame (README: 413) is
    refused before it is queued, naming the row and what to send instead, and the proxy serves on
    (a promise with no test before: it needs a row of 64 MiB)."""
    elements = (64 << 20) // 4 + 1024  # FP32: a little more than one frame's bytes
    header = {"inputs": [{"name": "X", "shape": [1, elements], "datatype": "FP32",
                          "parameters": {"binary_data_size": elements * 4}}]}  # fmt: skip
    proxy = corral_factory("--max-body-bytes=100000000")  # a worker that declares no tensors
    answer = post(proxy, INFER, header, bytes(elements * 4), timeout=120)
    assert answer.status_code == 413, answer.text[:300]
    message = answer.json()["error"]
    assert message.startswith("row 0 of the inputs takes"), message
    assert "send fewer elements per row, in more rows of the batch dimension" in message
    assert proxy.post({"after": 1}).json()["echo"] == {"after": 1}
