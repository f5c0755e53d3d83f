"""Every answer /infer can give, driven through the real binary and real Python workers."""

from __future__ import annotations

import asyncio
import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgpack
import pytest

from conftest import ECHO


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    from conftest import Corral

    corral = Corral(
        tmp_path_factory.mktemp("answers"),
        "--max-body-bytes=65536",
        "--max-batch-size=16",
        "--max-wait-ms=20",
        workers=2,
    )
    yield corral
    assert corral.stop() == 0


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    uuid.UUID(response.headers["x-request-id"])
    return body


def test_200_json_echo_with_request_id(proxy):
    response = proxy.post({"hello": "world", "n": [1, 2.5, None]})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json()["echo"] == {"hello": "world", "n": [1, 2.5, None]}
    assert uuid.UUID(response.headers["x-request-id"]).version == 4


def test_each_response_has_its_own_request_id(proxy):
    ids = {proxy.post(1).headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3


def test_200_msgpack_in_and_out(proxy):
    body = msgpack.packb({"bytes": b"\x00\x01", "x": 7})
    response = proxy.client.post(
        "/infer", content=body, headers={"content-type": "application/msgpack"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(response.content)["echo"] == {"bytes": b"\x00\x01", "x": 7}


def test_json_in_msgpack_out_by_accept(proxy):
    response = proxy.post([1, 2], headers={"accept": "application/msgpack"})
    assert response.status_code == 200
    assert msgpack.unpackb(response.content)["echo"] == [1, 2]


def test_400_malformed_json_and_msgpack(proxy):
    bad_json = proxy.client.post(
        "/infer", content=b'{"a": ', headers={"content-type": "application/json"}
    )
    assert "JSON" in assert_error(bad_json, 400, "bad_request")["message"]
    bad_msgpack = proxy.client.post(
        "/infer", content=b"\x92\x01", headers={"content-type": "application/msgpack"}
    )
    assert "msgpack" in assert_error(bad_msgpack, 400, "bad_request")["message"]


def test_a_json_body_that_cannot_be_read_says_why_in_the_clients_terms(proxy):
    # Each had been serde's bare "expected value at line 1 column 1" (or "invalid unicode code
    # point"), leaving the client to guess what was wrong with the request.
    png = b"\x89PNG\r\n\x1a\n"
    unnamed = proxy.client.post("/infer", content=png)  # no Content-Type at all
    message = assert_error(unnamed, 400, "bad_request")["message"]
    assert "the request has no Content-Type, so its body was read as JSON" in message
    bom = proxy.client.post(
        "/infer", content=b'\xef\xbb\xbf{"a": 1}', headers={"content-type": "application/json"}
    )
    message = assert_error(bom, 400, "bad_request")["message"]
    assert "begins with a byte order mark, and JSON is UTF-8 without one" in message
    assert "no Content-Type" not in message
    for charset, body in (("utf-16", "{}".encode("utf-16")), ('"latin1"', b"{\xe9}")):
        headers = {"content-type": f"application/json; charset={charset}"}
        other = proxy.client.post("/infer", content=body, headers=headers)
        message = assert_error(other, 415, "unsupported_media_type")["message"]
        assert f"charset={charset.strip(chr(34))}, but JSON is UTF-8" in message
    # UTF-16 without a byte order mark (.NET's Encoding.Unicode) is UTF-8 bytes all, with NULs
    # between, which JSON's text never holds.
    headers = {"content-type": "application/json; charset=utf-16le"}
    unmarked = proxy.client.post("/infer", content='{"a": 1}'.encode("utf-16-le"), headers=headers)
    message = assert_error(unmarked, 415, "unsupported_media_type")["message"]
    assert "charset=utf-16le, but JSON is UTF-8" in message
    # UTF-8 that is no JSON is that, whatever its charset; a byte order mark with no
    # Content-Type is still JSON meant as JSON (no hint to send raw bytes).
    headers = {"content-type": "application/json; charset=windows-1252"}
    cut = proxy.client.post("/infer", content=b'{"t":', headers=headers)
    assert assert_error(cut, 400, "bad_request")["message"].startswith("body is not valid JSON")
    bom = proxy.client.post("/infer", content=b'\xef\xbb\xbf{"a": 1}')
    message = assert_error(bom, 400, "bad_request")["message"]
    assert "byte order mark" in message and "no Content-Type" not in message
    # One that reads as UTF-8 is served whatever its charset says (.NET's Encoding.Default
    # names windows-1252 for ASCII JSON).
    for utf8 in ("utf-8", "UTF-8", '"utf-8"', "us-ascii", "windows-1252"):
        headers = {"content-type": f"application/json; charset={utf8}"}
        assert proxy.client.post("/infer", content=b'{"a": 1}', headers=headers).status_code == 200


def test_400_bad_timeout_header(proxy):
    response = proxy.post(1, headers={"x-corral-timeout-ms": "soon"})
    assert_error(response, 400, "bad_request")


def test_404_unknown_route(proxy):
    assert_error(proxy.client.get("/nope"), 404, "not_found")


def test_405_wrong_method(proxy):
    response = proxy.client.get("/infer")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"


def test_406_unacceptable_accept(proxy):
    response = proxy.post(1, headers={"accept": "text/html"})
    assert_error(response, 406, "not_acceptable")


def test_several_items_for_a_client_that_takes_only_raw_bytes_are_406_before_they_run(
    corral_factory, tmp_path
):
    # Their answer is an array, JSON or msgpack: `Accept: image/png` cannot take it, and the
    # items once ran before the 406.
    from test_failures import received

    log = tmp_path / "received.jsonl"
    proxy = corral_factory(env={"SCRIPTED_LOG": str(log)})
    many = {"x-corral-items": "many", "accept": "image/png"}
    assert_error(proxy.post([1, 2], headers=many), 406, "not_acceptable")
    assert proxy.post("after").status_code == 200  # the worker logs every job it gets
    assert received(log) == ["after"]


def test_415_for_a_content_type_that_is_not_a_media_type(proxy):
    # Any media type but JSON, msgpack and a form is raw bytes (tests/test_raw_bodies.py); a
    # value that is not one (no type/subtype) is refused.
    for content_type in ("text", "image/", "image png"):
        # Answered before its body is read, the connection may close: not one to reuse.
        headers = {"content-type": content_type, "connection": "close"}
        response = proxy.client.post("/infer", content=b"1", headers=headers)
        body = assert_error(response, 415, "unsupported_media_type")
        assert "is not a media type" in body["message"]
    # One that is a media type but longer than Corral passes on says so: "not a media type"
    # had been said of a long `filename` parameter.
    long = 'application/octet-stream; filename="' + "f" * 1000 + '.bin"'
    response = proxy.client.post(
        "/infer", content=b"1", headers={"content-type": long, "connection": "close"}
    )
    body = assert_error(response, 415, "unsupported_media_type")
    assert f"is {len(long)} bytes, longer than the 1024" in body["message"], body


def test_a_compressed_body_is_415_not_taken_for_its_content(proxy):
    # Passed on, the worker would read the gzip bytes as the input.
    headers = {"content-encoding": "gzip", "connection": "close"}
    response = proxy.client.post("/infer", content=b"\x1f\x8b\x08\x00", headers=headers)
    body = assert_error(response, 415, "unsupported_media_type")
    assert body["message"] == 'Content-Encoding "gzip" is not supported: send the body uncompressed'
    # RFC 9110 15.5.16: the answer names the coding Corral reads.
    assert response.headers["accept-encoding"] == "identity"
    response = proxy.post([1], headers={"content-encoding": "identity"})
    assert response.status_code == 200 and response.json()["echo"] == [1]


def test_nan_and_infinity_go_back_in_msgpack_and_are_500_as_json(proxy):
    # JSON has no NaN nor infinity: serde_json would write null, another value than the
    # worker's.
    body = msgpack.packb([float("inf"), float("-inf"), 1.5])
    headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    response = proxy.client.post("/infer", content=body, headers=headers)
    assert msgpack.unpackb(response.content)["echo"] == [float("inf"), float("-inf"), 1.5]
    headers["accept"] = "application/json"
    response = proxy.client.post("/infer", content=body, headers=headers)
    message = assert_error(response, 500, "unrepresentable_output")["message"]
    assert "NaN or infinity" in message and "msgpack can" in message


def test_a_map_key_json_cannot_carry_is_named_as_such_not_as_any_non_string_key(proxy):
    # serde's "key must be a string" denied what goes through: number and boolean keys are
    # written as JSON strings.
    headers = {"content-type": "application/msgpack", "accept": "application/json"}
    served = proxy.client.post("/infer", content=msgpack.packb({1.5: 2, True: 3}), headers=headers)
    assert served.json()["echo"] == {"1.5": 2, "true": 3}
    body = msgpack.packb({b"k": 1}, use_bin_type=True)
    response = proxy.client.post("/infer", content=body, headers=headers)
    message = assert_error(response, 500, "unrepresentable_output")["message"]
    assert "a map key that is not a string, a number or a boolean" in message, message
    assert "must be a string" not in message, message


def test_a_nan_among_a_thousand_items_fails_that_item_alone_in_json(proxy):
    """At the size clients send (1,000 items, many batches): one item's NaN output once failed
    the whole JSON answer with no list; it is that item's failure, listed by index."""
    items = [{"n": n} for n in range(1000)]
    items[500] = float("nan")
    headers = {
        "content-type": "application/msgpack",
        "accept": "application/json",
        "x-corral-items": "many",
    }
    response = proxy.client.post("/infer", content=msgpack.packb(items), headers=headers)
    body = assert_error(response, 500, "unrepresentable_output")
    assert body["message"] == "1 of 1000 items failed"
    assert [item["index"] for item in body["items"]] == [500]
    # Without it, all 1,000 come back in order, as JSON.
    items[500] = {"n": 500}
    response = proxy.client.post("/infer", content=msgpack.packb(items), headers=headers)
    assert [answer["echo"]["n"] for answer in response.json()] == list(range(1000))


def test_an_output_too_deep_to_be_an_item_of_a_msgpack_answer_fails_that_item_alone(proxy):
    """An item nested 127 levels is read (the body's array makes it 128); the worker's answer
    wraps it once more, and the answer's array would then be one level deeper than Corral reads
    anything (the fuzzer's find): that item is a 500 of its own, its batch-mate is answered."""
    deep = []
    for _ in range(126):
        deep = [deep]
    headers = {
        "content-type": "application/msgpack",
        "accept": "application/msgpack",
        "x-corral-items": "many",
    }
    body = msgpack.packb([{"n": 1}, deep], use_bin_type=True)
    response = proxy.client.post("/infer", content=body, headers=headers)
    body = assert_error(response, 500, "unrepresentable_output")
    assert body["message"] == "1 of 2 items failed"
    assert [item["index"] for item in body["items"]] == [1]
    assert "nested 128 levels deep" in body["items"][0]["message"]
    # One level less, and both come back.
    response = proxy.client.post(
        "/infer", content=msgpack.packb([{"n": 1}, deep[0]]), headers=headers
    )
    assert response.status_code == 200, response.text
    assert [answer["echo"] for answer in msgpack.unpackb(response.content)] == [{"n": 1}, deep[0]]


def test_413_declared_and_streamed(proxy):
    big = json.dumps("x" * 70_000).encode()
    declared = proxy.client.post(
        "/infer", content=big, headers={"content-type": "application/json"}
    )
    assert_error(declared, 413, "body_too_large")

    def chunks():  # no Content-Length: the limit must hold while streaming
        for _ in range(10):
            yield b"x" * 10_000

    streamed = proxy.client.post(
        "/infer", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(streamed, 413, "body_too_large")


def test_500_when_forward_raises_and_the_worker_lives_on(proxy):
    body = assert_error(proxy.post({"raise": "kaboom"}), 500, "worker_error")
    assert "kaboom" in body["message"]
    assert proxy.post("after").json()["echo"] == "after"


def test_healthz_and_readyz(proxy):
    assert proxy.client.get("/healthz").status_code == 200
    ready = proxy.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["workers"] == 2


def test_256_concurrent_requests_form_batches(proxy):
    async def drive():
        limits = httpx.Limits(max_connections=256)
        async with httpx.AsyncClient(base_url=proxy.url, limits=limits, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post("/infer", json={"n": n, "nonce": str(uuid.uuid4())})
                    for n in range(256)
                )
            )

    responses = asyncio.run(drive())
    assert [r.status_code for r in responses] == [200] * 256
    for n, response in enumerate(responses):
        assert response.json()["echo"]["n"] == n
    sizes = [r.json()["batch_size"] for r in responses]
    assert max(sizes) > 1
    assert len({r.headers["x-request-id"] for r in responses}) == 256
    assert max(sizes) <= 16


def test_echo_example_serves(corral_factory):
    proxy = corral_factory(worker=ECHO, workers=1)
    assert proxy.post({"a": 1}).json() == {"a": 1}


MANY = {"x-corral-items": "many"}


def test_many_items_answer_an_array_in_order(proxy):
    items = [{"n": n} for n in range(5)]
    response = proxy.post(items, headers=MANY)
    assert response.status_code == 200, response.text
    assert [r["echo"] for r in response.json()] == items
    # Five items that fit in one batch travel together.
    assert {r["batch_size"] for r in response.json()} == {5}


def test_many_items_larger_than_a_batch_are_split_and_reassembled(proxy):
    items = list(range(40))  # max batch size here is 16
    response = proxy.post(items, headers=MANY)
    assert response.status_code == 200
    body = response.json()
    assert [r["echo"] for r in body] == items
    assert max(r["batch_size"] for r in body) <= 16


def test_many_items_in_msgpack(proxy):
    response = proxy.client.post(
        "/infer",
        content=msgpack.packb([b"\x01", "two"]),
        headers={**MANY, "content-type": "application/msgpack"},
    )
    assert response.status_code == 200
    assert [r["echo"] for r in msgpack.unpackb(response.content)] == [b"\x01", "two"]


def test_many_items_in_msgpack_get_a_workers_tensors_as_plain_arrays(corral_factory):
    # PROTOCOL.md: a tensor value that reaches a native client is written out as nested arrays
    # of numbers. Items asked for as msgpack had gone out as the worker's ext values (and a
    # malformed one with 200), while one item, or the same items as JSON, were written out.
    import struct

    from corral import _protocol as protocol
    from test_worker_protocol import FakeWorker

    proxy = corral_factory("--max-wait-ms=0", "--retries=0", worker=None)
    worker = FakeWorker(proxy.socket)
    proxy.wait_for_log(r"worker connected")

    def tensor(values: list[float]) -> bytes:
        data = struct.pack(f"<{len(values)}f", *values)
        return msgpack.packb(
            {"Y": msgpack.ExtType(1, msgpack.packb(["FP32", [len(values)], data]))}
        )

    def answered(outputs: list[bytes], accept: str) -> httpx.Response:
        headers = {**MANY, "accept": accept}
        with ThreadPoolExecutor(1) as pool:
            response = pool.submit(proxy.post, list(range(len(outputs))), headers=headers)
            jobs = []
            while len(jobs) < len(outputs):
                jobs += worker.receive()["jobs"]
            worker.send(protocol.results([protocol.ok(j["id"], o) for j, o in zip(jobs, outputs)]))
            return response.result()

    try:
        good = [tensor([1.0, 2.5]), tensor([-0.5])]
        response = answered(good, "application/msgpack")
        assert response.status_code == 200, response.text
        assert msgpack.unpackb(response.content) == [{"Y": [1.0, 2.5]}, {"Y": [-0.5]}]
        assert answered(good, "application/json").json() == [{"Y": [1.0, 2.5]}, {"Y": [-0.5]}]
        malformed = msgpack.packb({"Y": msgpack.ExtType(1, b"ab")})
        for accept in ("application/msgpack", "application/json"):
            body = assert_error(answered([good[0], malformed], accept), 500, "bad_output")
            assert [(i["index"], i["error"]) for i in body["items"]] == [(1, "bad_output")]
            assert "tensor value that is not well formed" in body["items"][0]["message"]
    finally:
        worker.close()


def test_many_items_of_a_real_tensor_worker_at_users_sizes_come_back_plain(corral_factory):
    # At the sizes of an embedding batch: 64 items of 32,768 values each, answered with them
    # doubled as FP32 (the package reads a native client's row as the declared tensor): an
    # 8 MiB result frame (far larger than a socket buffer) and an 18 MiB answer, from the
    # package's own tensor encoding, against an item answered alone.
    from pathlib import Path

    worker = str(Path(__file__).parent / "workers" / "tensor_echo.py")  # Y = X * 2, FP32
    proxy = corral_factory("--max-batch-size=64", worker=worker)
    items = [{"X": [i, 1] * 16384} for i in range(64)]  # small integers: a 2 MiB body
    headers = {**MANY, "content-type": "application/msgpack", "accept": "application/msgpack"}
    response = proxy.client.post("/infer", content=msgpack.packb(items), headers=headers)
    assert response.status_code == 200, response.text[:300]
    answers = msgpack.unpackb(response.content)
    assert len(answers) == 64
    for i, answer in enumerate(answers):
        assert answer == {"Y": [2.0 * i, 2.0] * 16384}, i
    one = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    single = proxy.client.post("/infer", content=msgpack.packb(items[5]), headers=one)
    assert msgpack.unpackb(single.content) == answers[5]


def test_many_items_with_a_failure_list_each_failed_index(proxy):
    items = [1, {"invalid": "no good"}, 3, {"invalid": "nor this"}]
    body = assert_error(proxy.post(items, headers=MANY), 422, "invalid_input")
    assert body["message"] == "2 of 4 items failed"
    assert [(i["index"], i["status"], i["message"]) for i in body["items"]] == [
        (1, 422, "no good"),
        (3, 422, "nor this"),
    ]


def test_many_items_edge_cases(proxy):
    assert proxy.post([], headers=MANY).json() == []
    assert_error(proxy.post({"not": "an array"}, headers=MANY), 400, "bad_request")
    assert_error(proxy.post([1], headers={"x-corral-items": "several"}), 400, "bad_request")
    # Without the header an array is one item.
    assert proxy.post([1, 2]).json()["echo"] == [1, 2]


def test_413_too_many_items_for_the_queue(proxy):
    # The queue holds 1024 jobs here: a request carrying more could never be admitted.
    body = assert_error(proxy.post(list(range(1025)), headers=MANY), 413, "too_many_items")
    assert "1025" in body["message"]


def test_options_read_their_corral_environment_variables(corral_factory):
    proxy = corral_factory(worker=None, env={"CORRAL_MAX_BODY_BYTES": "100"})
    assert_error(proxy.post("x" * 200), 413, "body_too_large")


def test_a_client_timeout_is_capped_by_the_proxy_s(corral_factory):
    proxy = corral_factory("--timeout-ms=2000", "--max-wait-ms=0")
    told = proxy.post({"x": 1}, headers={"x-corral-timeout-ms": "60000"}).json()["timeout_ms"]
    assert 0 < told <= 2000


def test_405_on_read_only_routes(proxy):
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        response = proxy.client.post(path)
        assert_error(response, 405, "method_not_allowed")
        # HEAD too: it is answered (RFC 9110 10.2.1 lists every method a resource takes).
        assert response.headers["allow"] == "GET, HEAD"


def test_415_for_a_form_says_how_to_send_json(proxy):
    # What `curl -d '{"x": 1}'` sends without a content-type header.
    response = proxy.client.post("/infer", data={"x": "1"})
    assert_error(response, 415, "unsupported_media_type")
    assert "-H 'content-type: application/json'" in response.json()["message"]
