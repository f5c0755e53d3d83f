"""Raw request bodies end to end: a body of any media type but JSON, msgpack and a form reaches
the worker as `bytes` with its media type, and an output of bytes comes back raw to a client that
accepts it (PROTOCOL.md, "Raw bytes"; docs/ARCHITECTURE.md, "Raw bodies").

The worker (tests/workers/negative.py) inverts grayscale PNGs and says in the answer's `tEXt`
chunks what media type it saw and what its batch held. The PNGs are written and read here with
the standard library alone, independently of the worker's own code.
"""

from __future__ import annotations

import json
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest

from conftest import ECHO, ROOT, Corral

NEGATIVE = str(ROOT / "tests" / "workers" / "negative.py")
SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_BODY = 64 * 1024


def make_png(rows: list[list[int]]) -> bytes:
    """An 8-bit grayscale PNG of these pixel rows (unfiltered)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    header = struct.pack(">IIBBBBB", len(rows[0]), len(rows), 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\x00" + bytes(row) for row in rows))
    return SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def read_png(data: bytes) -> tuple[list[list[int]], dict[str, str]]:
    """The pixel rows and the tEXt notes of an 8-bit grayscale, unfiltered PNG."""
    assert data.startswith(SIGNATURE), data[:16]
    at, notes, pixels, width = len(SIGNATURE), {}, b"", 0
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length : at + 12 + length])[0] == zlib.crc32(
            kind + body
        )
        if kind == b"IHDR":
            width = struct.unpack(">I", body[:4])[0]
        elif kind == b"IDAT":
            pixels += body
        elif kind == b"tEXt":
            key, value = body.split(b"\x00", 1)
            notes[key.decode()] = value.decode()
        at += 12 + length
    raw = zlib.decompress(pixels)
    rows = [list(raw[i + 1 : i + 1 + width]) for i in range(0, len(raw), width + 1)]
    return rows, notes


IMAGE = [[0, 64, 128], [255, 10, 200]]
NEGATIVE_IMAGE = [[255, 191, 127], [0, 245, 55]]
PNG = make_png(IMAGE)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    corral = Corral(
        tmp_path_factory.mktemp("raw"),
        f"--max-body-bytes={MAX_BODY}",
        "--batch-policy=fixed",
        "--max-batch-size=2",
        "--max-wait-ms=5000",
        worker=NEGATIVE,
    )
    yield corral
    assert corral.stop() == 0


def post_png(proxy: Corral, body: bytes = PNG, **headers: str):
    return proxy.client.post(
        "/infer",
        content=body,
        # One request alone waits for a batch-mate up to --max-wait-ms: not here.
        headers={"content-type": "image/png", "x-corral-timeout-ms": "20000", **headers},
    )


def alone(proxy: Corral, body: bytes, headers: dict[str, str]):
    """Posts two identical requests at once, so that their batch is full at once (the stage
    waits for a second item otherwise); returns the first answer (both must be the same)."""
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: post_png(proxy, body, **headers), range(2))
    assert (first.status_code, first.content) == (second.status_code, second.content)
    return first


TAKES_RAW = [None, "*/*", "image/png", "image/*", "application/octet-stream"]


@pytest.mark.parametrize("accept", TAKES_RAW)
def test_a_png_in_gives_png_bytes_out_to_a_client_that_takes_them(proxy, accept):
    headers = {"accept": accept} if accept else {}
    response = alone(proxy, PNG, headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    rows, notes = read_png(response.content)
    assert rows == NEGATIVE_IMAGE
    assert notes["content-type"] == "image/png"


def test_a_json_or_msgpack_client_of_a_raw_request_gets_the_bytes_in_its_format(proxy):
    as_json = alone(proxy, PNG, {"accept": "application/json"})
    assert as_json.status_code == 200
    assert as_json.headers["content-type"] == "application/json"
    assert read_png(bytes(as_json.json()))[0] == NEGATIVE_IMAGE  # bytes as JSON: numbers
    as_msgpack = alone(proxy, PNG, {"accept": "application/msgpack"})
    assert as_msgpack.headers["content-type"] == "application/msgpack"
    assert read_png(msgpack.unpackb(as_msgpack.content))[0] == NEGATIVE_IMAGE


def test_the_worker_sees_the_media_type_as_the_client_sent_it(proxy):
    response = alone(proxy, PNG, {"content-type": 'image/png; comment="from a test"'})
    assert response.status_code == 200
    assert read_png(response.content)[1]["content-type"] == 'image/png; comment="from a test"'


def test_a_client_accepting_only_another_type_gets_406(proxy):
    response = alone(proxy, PNG, {"accept": "image/jpeg"})
    assert response.status_code == 406
    assert response.json()["error"] == "not_acceptable"


def test_a_raw_body_the_worker_refuses_is_its_422(proxy):
    response = alone(proxy, b"GIF89a", {"content-type": "image/gif"})
    assert response.status_code == 422
    assert "expected image/png, got 'image/gif'" in response.json()["message"]


def test_a_json_client_and_a_raw_client_share_a_batch_and_both_get_their_answer(proxy):
    with ThreadPoolExecutor(2) as pool:
        raw = pool.submit(post_png, proxy)
        as_json = pool.submit(
            proxy.client.post, "/infer", json={"n": 7}, headers={"x-corral-timeout-ms": "20000"}
        )
        raw, as_json = raw.result(), as_json.result()
    assert as_json.status_code == 200 and raw.status_code == 200
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json()["echo"] == {"n": 7}
    # Batch-mates: each saw the other's media type in its batch (a full batch of 2 goes at once).
    assert sorted(as_json.json()["content_types"], key=str) == [None, "image/png"]
    rows, notes = read_png(raw.content)
    assert rows == NEGATIVE_IMAGE and raw.headers["content-type"] == "image/png"
    assert sorted(json.loads(notes["batch"]), key=str) == [None, "image/png"]


def test_a_raw_body_can_be_streamed(proxy):
    # A plain worker's answer to a streaming client is one chunk: the bytes, in JSON.
    def stream(_):
        headers = {"content-type": "image/png", "accept": "text/event-stream"}
        headers["x-corral-timeout-ms"] = "20000"
        with proxy.client.stream("POST", "/infer", content=PNG, headers=headers) as response:
            return response.status_code, response.read().decode()

    with ThreadPoolExecutor(2) as pool:
        (status, text), _ = pool.map(stream, range(2))
    assert status == 200
    events = [block for block in text.split("\n\n") if block]
    assert events[0].startswith("data: ") and events[-1].startswith("event: done")
    assert read_png(bytes(json.loads(events[0][len("data: ") :])))[0] == NEGATIVE_IMAGE


def test_a_form_is_still_refused_with_the_fix(proxy):
    # Answered before its body is read, the connection may close: not one to reuse.
    response = proxy.client.post("/infer", data={"x": "1"}, headers={"connection": "close"})
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"
    assert "-H 'content-type: application/json'" in response.json()["message"]


def test_raw_bytes_are_one_item(proxy):
    response = post_png(proxy, **{"x-corral-items": "many", "connection": "close"})
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "bad_request" and "x-corral-items" in body["message"]


def test_a_job_larger_than_the_batch_budget_goes_alone_up_to_what_a_frame_carries(tmp_path):
    # Bodies past the default batch budget (24 MiB) are taken, up to what one frame carries
    # (64 MiB less the frame's own bytes and the head limit); past that, a 413 naming the limit.
    proxy = Corral(tmp_path, f"--max-body-bytes={66 * 1024 * 1024}", worker=ECHO)
    try:
        raw = {"content-type": "application/octet-stream", "accept": "application/octet-stream"}
        body = bytes(range(256)) * (40 * 1024 * 1024 // 256)
        response = proxy.client.post("/infer", content=body, headers=raw)
        assert response.status_code == 200, response.text
        assert response.content == body, "echoed whole"
        too_large = proxy.client.post("/infer", content=bytes(64 * 1024 * 1024), headers=raw)
        assert too_large.status_code == 413
        assert too_large.json()["error"] == "body_too_large"
        assert "once encoded as msgpack" in too_large.json()["message"]
        assert proxy.client.post("/infer", json=[1]).status_code == 200, "the proxy unharmed"
    finally:
        proxy.stop()


def test_64_clients_of_3_mb_bodies_batch_within_the_default_byte_budget(tmp_path):
    # Without the budget, up to 21 of these would share one 64 MiB frame; with its default,
    # 24 MiB, a batch holds at most 8 (each job: its 3,000,000 bytes and a 5-byte bin header).
    # 64 clients at once queue far more than that behind the first batch, which the worker holds
    # until they have (however slowly a loaded machine uploads them).
    sizes = str(ROOT / "tests" / "workers" / "sizes.py")
    gate = tmp_path / "gate"
    env = {"SIZES_GATE": str(gate)}
    proxy = Corral(tmp_path, f"--max-body-bytes={4 * 1024 * 1024}", worker=sizes, env=env)
    try:
        raw = {"content-type": "application/octet-stream"}
        bodies = [bytes([i]) * 3_000_000 for i in range(64)]
        with ThreadPoolExecutor(64) as pool:
            send = lambda body: proxy.client.post("/infer", content=body, headers=raw)  # noqa: E731
            sent = pool.map(send, bodies)
            proxy.wait_until(
                lambda: proxy.metric("corral_queue_depth", stage="default") >= 8,
                what="a full batch's worth queued",
            )
            gate.touch()
            answers = list(sent)
        assert all(answer.status_code == 200 for answer in answers)
        batches = [answer.json()["batch"] for answer in answers]
        assert all(answer.json()["size"] == 3_000_000 for answer in answers)
        assert all(sum(batch) <= 24 * 1024 * 1024 for batch in batches)
        assert max(len(batch) for batch in batches) == 8, "full batches formed, at the budget"
    finally:
        proxy.stop()


def test_a_raw_body_over_the_limit_is_413_declared_or_streamed(proxy):
    big = b"\x00" * (MAX_BODY + 1)
    declared = post_png(proxy, big, **{"content-type": "application/octet-stream"})
    assert declared.status_code == 413
    assert declared.json()["error"] == "body_too_large"

    def chunks():  # no Content-Length: the limit must hold while the body streams in
        for _ in range(MAX_BODY // 8192 + 1):
            yield b"\x00" * 8192

    streamed = proxy.client.post(
        "/infer", content=chunks(), headers={"content-type": "application/octet-stream"}
    )
    assert streamed.status_code == 413
    assert streamed.json()["error"] == "body_too_large"
    # Exactly the limit is taken: the limit counts the body, not the header the proxy adds.
    at_limit = b"\x89PNG" + b"\x00" * (MAX_BODY - 4)
    response = alone(proxy, at_limit, {"content-type": "image/png"})
    # Read whole and sent on: the worker's own refusal.
    assert response.status_code == 422
    assert "not a PNG" in response.json()["message"]


def test_octet_stream_in_gives_octet_stream_out(corral_factory):
    # The echo worker names no media type: bytes go back as application/octet-stream, the
    # same bytes, chunked or not.
    proxy = corral_factory(worker=ECHO)
    body = bytes(range(256)) * 300  # over one socket buffer's worth of frames
    headers = {"content-type": "application/octet-stream"}
    response = proxy.client.post("/infer", content=body, headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.content == body
    chunked = proxy.client.post("/infer", content=iter([body[:1000], body[1000:]]), headers=headers)
    assert chunked.content == body
    # A JSON client naming octet-stream gets bytes the worker returned raw too.
    as_json = proxy.client.post(
        "/infer", content=msgpack.packb(b"abc"), headers={
            "content-type": "application/msgpack", "accept": "application/octet-stream"
        }
    )  # fmt: skip
    assert as_json.headers["content-type"] == "application/octet-stream"
    assert as_json.content == b"abc"


def test_a_worker_naming_no_media_type_fails_that_job_with_bad_output(corral_factory):
    proxy = corral_factory(
        "--max-wait-ms=0", worker=NEGATIVE, env={"NEGATIVE_OUTPUT_TYPE": "image png"}
    )
    response = proxy.client.post("/infer", content=PNG, headers={"content-type": "image/png"})
    assert response.status_code == 500
    body = response.json()
    assert body["error"] == "bad_output" and "image png" in body["message"]
    # Its other outputs (not bytes) stand, and the worker keeps its connection.
    assert proxy.post({"n": 1}).json()["echo"] == {"n": 1}


def test_multi_mib_bodies_from_64_clients_come_back_whole(corral_factory):
    # Batches of several 2 MiB raw payloads: frames far past a socket buffer, written as
    # segments around the bodies themselves; each client gets its own bytes back. (A deadline
    # far beyond the work: on a loaded machine the 5 s default can be predicted unreachable.)
    proxy = corral_factory("--timeout-ms=60000", worker=ECHO)
    headers = {"content-type": "application/octet-stream"}

    def one(i):
        body = bytes([i]) * (2 * 1024 * 1024) + i.to_bytes(4, "big")
        response = proxy.client.post("/infer", content=body, headers=headers)
        return response.status_code, response.content == body

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(one, range(64)))
    assert answers == [(200, True)] * 64


def test_a_structured_json_media_type_is_json_not_raw_bytes(corral_factory):
    # `+json` types (RFC 6839) are JSON text: the worker gets the value, not its bytes, and the
    # client its value back as JSON. Taken for raw bytes, the echo answered the bytes.
    proxy = corral_factory(worker=ECHO)
    for media_type in ["application/vnd.api+json", "Application/CloudEvents+JSON; charset=utf-8"]:
        body = json.dumps({"data": {"type": "doc", "id": "1"}})
        response = proxy.client.post("/infer", content=body, headers={"content-type": media_type})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {"data": {"type": "doc", "id": "1"}}
    malformed = proxy.client.post(
        "/infer", content=b"{not json", headers={"content-type": "application/problem+json"}
    )
    assert malformed.status_code == 400 and malformed.json()["error"] == "bad_request"
