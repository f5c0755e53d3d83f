"""Deadlines from the mesh: each header a caller in front of Corral uses to say how long it will
wait shortens the job's deadline (the worker sees it as `timeout_ms`), the earliest one wins, and
a value that does not parse is a 400 naming its header."""

import pytest


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    from conftest import Corral

    corral = Corral(tmp_path_factory.mktemp("mesh"), "--timeout-ms=60000", "--max-wait-ms=0")
    yield corral
    corral.stop()


def told(proxy, headers) -> int:
    """The time the worker was told the job has left."""
    answer = proxy.post({"x": 1}, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()["timeout_ms"]


@pytest.mark.parametrize(
    "header, value",
    [
        ("x-corral-timeout-ms", "30000"),
        ("x-envoy-expected-rq-timeout-ms", "30000"),
        ("grpc-timeout", "30S"),
        ("grpc-timeout", "30000m"),
        ("request-timeout", "30"),
    ],
)
def test_each_mesh_header_sets_the_deadline(proxy, header, value):
    # Within the little time the job took to reach the worker: a unit misread (30 ms, or the
    # route's 60 s) is outside.
    assert 25000 < told(proxy, {header: value}) <= 30000


def test_the_earliest_header_wins(proxy):
    headers = {
        "x-corral-timeout-ms": "9000",
        "x-envoy-expected-rq-timeout-ms": "8000",
        "grpc-timeout": "6S",
        "request-timeout": "7.5",
    }
    assert 5000 < told(proxy, headers) <= 6000
    assert 6500 < told(proxy, {**headers, "grpc-timeout": "1M"}) <= 7500


def test_the_route_timeout_still_caps(proxy):
    assert 55000 < told(proxy, {"grpc-timeout": "2H"}) <= 60000
    # Milliseconds past what 64 bits hold are a deadline as long as any (a 400 had said they
    # were no whole number), capped alike.
    for header in ["x-corral-timeout-ms", "x-envoy-expected-rq-timeout-ms"]:
        assert 55000 < told(proxy, {header: "9" * 30}) <= 60000


@pytest.mark.parametrize(
    "header, value",
    [
        ("x-envoy-expected-rq-timeout-ms", "soon"),
        ("grpc-timeout", "3s"),
        ("grpc-timeout", "123456789S"),
        ("request-timeout", "-1"),
        ("x-corral-timeout-ms", "0"),
    ],
)
def test_a_bad_value_is_a_400_naming_its_header(proxy, header, value):
    answer = proxy.post({"x": 1}, headers={header: value})
    assert answer.status_code == 400
    assert answer.json()["message"].startswith(header)
