"""Hostile or careless bodies get a clear 4xx each, and never take the proxy down."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import pytest


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    from conftest import Corral

    corral = Corral(tmp_path_factory.mktemp("robust"), worker=None)
    yield corral
    assert corral.stop() == 0


def send(proxy, body: bytes, content_type: str = "application/json", **headers):
    return proxy.client.post(
        "/infer", content=body, headers={"content-type": content_type, **headers}
    )


@pytest.mark.parametrize(
    ("name", "body", "content_type"),
    [
        ("deep JSON", b"[" * 100_000 + b"]" * 100_000, "application/json"),
        ("deep msgpack", b"\x91" * 1_000_000 + b"\xc0", "application/msgpack"),
        ("huge number", b"1e999999", "application/json"),
        ("invalid UTF-8", b'"\xff\xfe"', "application/json"),
        ("invalid UTF-8 in a msgpack string", b"\xa2\xff\xfe", "application/msgpack"),
        ("invalid UTF-8 in a msgpack map key", b"\x81\xa1\xc3\x01", "application/msgpack"),
        ("integer beyond 64 bits", b"12345678901234567890123", "application/json"),
        ("negative integer beyond 64 bits", b'{"id": -9223372036854775809}', "application/json"),
        ("empty JSON", b"", "application/json"),
        ("empty msgpack", b"", "application/msgpack"),
        ("msgpack with trailing bytes", b"\x01\x02", "application/msgpack"),
        ("truncated msgpack", b"\x92\x01", "application/msgpack"),
    ],
)
def test_malformed_bodies_are_400(proxy, name, body, content_type):
    response = send(proxy, body, content_type)
    assert response.status_code == 400, (name, response.text)
    assert response.json()["error"] == "bad_request"
    assert proxy.client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("content_type", "nest", "deepest"),
    [
        ("application/json", lambda n: b"[" * n + b"]" * n, 127),
        ("application/msgpack", lambda n: b"\x91" * n + b"\xc0", 128),
    ],
)
def test_nesting_is_refused_just_past_the_documented_depth(proxy, content_type, nest, deepest):
    """README: a body may nest 128 levels, a JSON one 127. The deepest passes the parse (no
    worker here, so it waits in the queue for its 408: 200 ms, time for its body to arrive after
    its head, which a 1 ms deadline would make a 408 `body_timeout`), one more is the 400."""
    fits = send(proxy, nest(deepest), content_type, **{"x-corral-timeout-ms": "200"})
    assert (fits.status_code, fits.json()["error"]) == (408, "deadline_exceeded"), fits.text
    too_deep = send(proxy, nest(deepest + 1), content_type)
    assert too_deep.status_code == 400 and too_deep.json()["error"] == "bad_request"


def test_deep_multi_item_body_is_400(proxy):
    response = send(proxy, b"[" * 100_000 + b"]" * 100_000, **{"x-corral-items": "many"})
    assert response.status_code == 400


def test_a_body_shorter_than_its_content_length_is_400(proxy):
    url = urlparse(proxy.url)
    with socket.create_connection((url.hostname, url.port), timeout=20) as conn:
        conn.sendall(
            b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n[1, 2"
        )
        conn.shutdown(socket.SHUT_WR)  # the client gives up before the promised 100 bytes
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b'"error":"bad_request"' in answer, answer
    assert proxy.client.get("/healthz").status_code == 200


def test_an_integer_beyond_64_bits_is_refused_with_the_reason(proxy):
    response = send(proxy, b'{"id": 12345678901234567890123}')
    assert response.status_code == 400
    assert "64 bits" in response.json()["message"]


def test_a_msgpack_string_that_is_not_utf8_is_refused_with_the_reason(proxy):
    response = send(proxy, b"\x91\xa2\xff\xfe", "application/msgpack")
    assert response.status_code == 400
    assert "UTF-8" in response.json()["message"]


def test_integers_within_64_bits_reach_the_worker_exactly(corral_factory):
    proxy = corral_factory()
    numbers = [18446744073709551615, -9223372036854775808, 9007199254740993]
    body = b"[18446744073709551615, -9223372036854775808, 9007199254740993]"
    response = send(proxy, body)
    assert response.status_code == 200
    assert response.json()["echo"] == numbers
    # Raw bytes (msgpack bin) are not strings: they pass whatever they hold.
    packed = b"\x81\xa4blob\xc4\x02\xff\xfe"
    response = send(proxy, packed, "application/msgpack", accept="application/json")
    assert response.status_code == 200, response.text
    assert response.json()["echo"] == {"blob": [255, 254]}  # bytes, written as JSON
