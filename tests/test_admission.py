"""Deadline-aware admission under a burst: a job is either answered in time or refused at once
(503 deadline_unreachable), never admitted to time out."""

from __future__ import annotations

import http.client
import json
import socket
from urllib.parse import urlparse

CLIENTS = 12


class KeptAlive:
    """One client connection, opened (and proven served) before the burst, so that the burst's
    requests reach the proxy as close together as the kernel delivers them."""

    def __init__(self, url: str) -> None:
        address = urlparse(url)
        self.sock = socket.create_connection((address.hostname, address.port))
        self.send(b"GET /healthz HTTP/1.1\r\nhost: corral\r\n\r\n")
        assert self.answer().status == 200

    def send(self, request: bytes) -> None:
        self.sock.sendall(request)

    def answer(self) -> http.client.HTTPResponse:
        response = http.client.HTTPResponse(self.sock)
        response.begin()
        response.body = response.read()
        return response


def post(body: object) -> bytes:
    payload = json.dumps(body).encode()
    head = "POST /infer HTTP/1.1\r\nhost: corral\r\ncontent-type: application/json\r\n"
    return f"{head}content-length: {len(payload)}\r\n\r\n".encode() + payload


def test_a_burst_admits_only_what_can_finish_in_time(corral_factory):
    # One job per batch, 500 ms each, 1.3 s to live (admitted if predicted done by 1,235 ms):
    # two fit one behind the other, a third not. The deadline sits halfway between two and
    # three jobs' cost, so that a loaded machine's slower sleeps change neither side.
    proxy = corral_factory("--max-batch-size=1", "--timeout-ms=1300")
    for _ in range(3):  # the cost is learned
        assert proxy.post({"sleep_ms": 500}).status_code == 200
    clients = [KeptAlive(proxy.url) for _ in range(CLIENTS)]
    request = post({"sleep_ms": 500})
    for client in clients:
        client.send(request)
    answers = [client.answer() for client in clients]
    for client in clients:
        client.sock.close()
    statuses = [a.status for a in answers]
    refused = [json.loads(a.body)["error"] for a in answers if a.status == 503]
    assert refused == ["deadline_unreachable"] * len(refused), statuses
    assert set(statuses) <= {200, 503}, f"an admitted job was not answered in time: {statuses}"
    assert refused, "some of the burst cannot finish in time"
    assert 200 in statuses, "what can finish in time is admitted"
