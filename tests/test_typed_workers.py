"""Typed workers end to end: a JSON client sends and gets what the worker's JSON Schema (in
`/openapi.json`) says, also for the values msgpack writes otherwise — bytes as base64 strings, a
timezone-aware datetime as an RFC 3339 string — and a msgpack client gets the same answer (it may
send bytes as `bin`).

The worker (tests/workers/stamped.py) answers an upload with its bytes reversed, their count and
its time in UTC."""

from __future__ import annotations

import base64
import datetime
import random

import jsonschema
import msgpack
import numpy as np
import pytest
import tritonclient.http as triton

from conftest import ROOT, Corral

STAMPED = str(ROOT / "tests" / "workers" / "stamped.py")
DATA = b"\x00\xffcorral"
UPLOAD = {"name": "a", "data": base64.b64encode(DATA).decode(), "at": "2024-05-06T07:08:09+02:00"}
RECEIPT = {
    "name": "a",
    "reversed": base64.b64encode(DATA[::-1]).decode(),
    "size": len(DATA),
    "at": "2024-05-06T05:08:09Z",
}
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    corral = Corral(tmp_path_factory.mktemp("typed"), worker=STAMPED)
    yield corral
    assert corral.stop() == 0


def test_a_json_client_sends_and_gets_bytes_and_datetimes_as_the_schema_says(proxy):
    response = proxy.post(UPLOAD)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer == RECEIPT
    document = proxy.client.get("/openapi.json").json()
    ok = document["paths"]["/infer"]["post"]["responses"]["200"]["content"]
    schema = {**ok["application/json"]["schema"], "components": document["components"]}
    jsonschema.validate(answer, schema)  # its refs point into the document's components
    receipt = document["components"]["schemas"]["Receipt"]["properties"]
    assert receipt["reversed"] == {"type": "string", "contentEncoding": "base64"}
    assert receipt["at"]["type"] == "string"


def test_an_aware_datetime_reaches_a_json_client_as_a_string(proxy):
    # Sent as msgpack with its bytes as bin, answered as JSON: msgpack's timestamp extension,
    # which the answer once held, has no JSON form (500 unrepresentable_output).
    upload = {**UPLOAD, "data": DATA}
    headers = {"content-type": "application/msgpack", "accept": "application/json"}
    response = proxy.client.post("/infer", content=msgpack.packb(upload), headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["at"] == "2024-05-06T05:08:09Z"


def test_a_msgpack_client_may_send_bin_and_gets_what_a_json_client_gets(proxy):
    # Its time as msgpack's timestamp: the decoder takes it where a datetime goes.
    at = datetime.datetime(2024, 5, 6, 5, 8, 9, tzinfo=datetime.timezone.utc)
    upload = {"name": "a", "data": DATA, "at": msgpack.Timestamp.from_datetime(at)}
    response = proxy.client.post("/infer", content=msgpack.packb(upload), headers=MSGPACK)
    assert response.status_code == 200, response.text
    assert msgpack.unpackb(response.content) == RECEIPT
    # And its base64 string, as a JSON client sends it.
    response = proxy.client.post("/infer", content=msgpack.packb(UPLOAD), headers=MSGPACK)
    assert msgpack.unpackb(response.content) == RECEIPT


def test_a_string_that_is_not_base64_is_422_with_its_path_alone(proxy):
    bad = {**UPLOAD, "data": "not base64!"}
    response = proxy.post([UPLOAD, bad], headers={"x-corral-items": "many"})
    assert response.status_code == 422, response.text
    (failed,) = response.json()["items"]
    assert failed["index"] == 1
    assert "base64" in failed["message"] and "$.data" in failed["message"]
    # A field of the wrong type still says so, with its path.
    response = proxy.post({**UPLOAD, "name": 5})
    assert response.status_code == 422, response.text
    assert "$.name" in response.json()["message"], response.text


def test_a_dict_output_holding_bytes_and_an_aware_datetime_reaches_a_json_client(corral_factory):
    # `output_type = dict` declares no form, but its values still reach a JSON client (an aware
    # datetime was 500 unrepresentable_output when such types skipped the conversion), and a
    # msgpack client gets the same.
    proxy = corral_factory(worker=STAMPED, env={"STAMPED_OUTPUT": "dict"})
    response = proxy.post(UPLOAD)
    assert response.status_code == 200, response.text
    assert response.json() == RECEIPT
    response = proxy.client.post("/infer", content=msgpack.packb(UPLOAD), headers=MSGPACK)
    assert msgpack.unpackb(response.content) == RECEIPT


def test_a_timestamp_from_a_worker_without_output_type_is_text_for_json(corral_factory):
    # With no `output_type` the worker writes an aware datetime as msgpack's timestamp (and its
    # bytes as a `bin`): a JSON client had 500 unrepresentable_output; the proxy writes the
    # timestamp as RFC 3339 text in UTC, and a msgpack client still gets the timestamp.
    proxy = corral_factory(worker=STAMPED, env={"STAMPED_OUTPUT": "none"})
    response = proxy.post(UPLOAD)
    assert response.status_code == 200, response.text
    assert response.json()["at"] == RECEIPT["at"]
    assert response.json()["reversed"] == list(DATA[::-1]), "a bin is an array of numbers"
    response = proxy.client.post("/infer", content=msgpack.packb(UPLOAD), headers=MSGPACK)
    stamp = msgpack.unpackb(response.content, timestamp=3)["at"]
    assert stamp == datetime.datetime(2024, 5, 6, 5, 8, 9, tzinfo=datetime.timezone.utc)
    # KServe v1 answers in JSON, as a JSON client is answered (it had 500 bad_output).
    response = proxy.client.post("/v1/models/default:predict", json={"instances": [UPLOAD]})
    assert response.status_code == 200, response.text
    assert response.json()["predictions"][0]["at"] == RECEIPT["at"]


@pytest.mark.parametrize("client", ["json", "msgpack with bin", "msgpack with base64"])
def test_megabytes_of_bytes_go_through_whole(proxy, client):
    """4 MiB of `bytes` in a typed request and its answer: a JSON client sends and gets base64, a
    msgpack client may send `bin`, and the answer's bytes are the worker's own (the upload
    reversed), in base64 as its schema says for both formats. The msgpack bodies reach the worker
    through the proxy's shared memory (`payload_at`), the JSON one transcoded, in its frame."""
    data = random.Random(client).randbytes(4 << 20)  # every byte value, in no pattern
    text = base64.b64encode(data).decode()
    upload = {"name": client, "data": text if client != "msgpack with bin" else data,
              "at": UPLOAD["at"]}  # fmt: skip
    if client == "json":
        response = proxy.post(upload)
        assert response.status_code == 200, response.text[:1000]
        assert response.headers["content-type"] == "application/json"
        answer = response.json()
    else:
        response = proxy.client.post("/infer", content=msgpack.packb(upload), headers=MSGPACK)
        assert response.status_code == 200, response.text[:1000]
        assert response.headers["content-type"] == "application/msgpack"
        answer = msgpack.unpackb(response.content)
    assert answer["name"] == client
    assert answer["size"] == len(data) == 4 << 20
    assert isinstance(answer["reversed"], str)
    assert base64.b64decode(answer["reversed"], validate=True) == data[::-1]


def test_a_v2_client_s_bytes_reach_a_field_of_str_as_text_and_one_of_bytes_as_bytes(
    corral_factory,
):
    # v2 has no string type but BYTES: a typed worker's `list[str]` field refused every v2
    # client's text (422 "Expected `str`, got `bytes`"), a native client's going in.
    proxy = corral_factory(worker=str(ROOT / "tests" / "workers" / "shouting.py"))
    text = triton.InferInput("text", [1, 2], "BYTES")
    text.set_data_from_numpy(np.array([["hello", "wörld"]], dtype=object))
    raw = triton.InferInput("raw", [1, 2], "BYTES")
    # UTF-8 that is base64 too, and no UTF-8: a field of bytes keeps both as they came.
    raw.set_data_from_numpy(np.array([[b"YQ==", b"\xff"]], dtype=object))
    with triton.InferenceServerClient(proxy.url.removeprefix("http://")) as client:
        answer = client.infer("default", [text, raw])
    assert answer.as_numpy("upper").tolist() == [[b"HELLO", "WÖRLD".encode()]]
    assert answer.as_numpy("sizes").tolist() == [[4, 1]]
