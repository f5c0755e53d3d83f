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
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
    assert proxy.client.get("/healthz").status_code == 200
