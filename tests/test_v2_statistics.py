"""Triton's statistics extension, read by tritonclient's own `get_inference_statistics` against
the real binary and the tensor-declaring worker (tests/workers/tensors.py): requests counted as
they succeed or fail, the rows inferred, and the batches the model's workers ran, by size."""

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import Corral
from test_v2 import WORKER, client, infer, rows, tensors


@pytest.fixture
def proxy(tmp_path):
    corral = Corral(tmp_path, worker=WORKER)
    yield corral
    corral.stop()


def stats_of(proxy, model="default") -> dict:
    with client(proxy) as c:
        found = c.get_inference_statistics(model)["model_stats"]
    assert [m["name"] for m in found] == [model]
    return found[0]


def test_a_model_s_statistics_count_its_requests_rows_and_batches(proxy):
    with client(proxy) as c:
        assert "statistics" in c.get_server_metadata()["extensions"]
    before = stats_of(proxy)
    assert before["inference_count"] == before["execution_count"] == 0
    assert before["last_inference"] == 0 and before["batch_stats"] == []
    assert before["inference_stats"]["success"] == {"count": 0, "ns": 0}

    started_ms = time.time() * 1000
    for n in (4, 4, 2):
        infer(proxy, *rows(n), True)
    # A request of three rows, one of which the worker rejects: a failure, two rows inferred.
    x, scale, _ = rows(3)
    words = np.array([[b"fine"], [b"reject"], [b"fine"]], dtype=object)
    with pytest.raises(InferenceServerException):
        infer(proxy, x, scale, words, True)
    # The model's requests in another protocol count too: KServe v1's, of two instances.
    instance = {"X": [1.0, 2.0, 3.0], "N": [2], "TEXT": ["abc"]}
    answer = proxy.client.post("/v1/models/default:predict", json={"instances": [instance] * 2})
    assert answer.status_code == 200, answer.text
    ended_ms = time.time() * 1000

    stats = stats_of(proxy)
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 4 and inference["success"]["ns"] > 0
    assert inference["fail"]["count"] == 1 and inference["fail"]["ns"] > 0
    # Where the successful requests' time went: each counted once.
    assert inference["queue"]["count"] == inference["compute_infer"]["count"] == 4
    assert 0 < inference["compute_infer"]["ns"] <= inference["success"]["ns"]
    assert inference["compute_input"]["count"] == 4
    # The rows of successful requests, as Triton counts (not the failed request's two rows the
    # worker answered).
    assert stats["inference_count"] == 4 + 4 + 2 + 2
    # In milliseconds since the epoch (within a minute of the clients' clock: no step breaks it).
    assert started_ms - 60_000 <= stats["last_inference"] <= ended_ms + 60_000
    # Every job rode a batch the worker finished: 15 jobs, in batches counted by size.
    batches = stats["batch_stats"]
    assert sum(b["compute_infer"]["count"] for b in batches) == stats["execution_count"] >= 5
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == 15
    assert all(b["compute_infer"]["ns"] > 0 for b in batches)
    assert [b["batch_size"] for b in batches] == sorted({b["batch_size"] for b in batches})

    # Every model at once (the default route is the only one here), and a version named.
    with client(proxy) as c:
        assert c.get_inference_statistics()["model_stats"] == [stats]
        assert c.get_inference_statistics("default", "1")["model_stats"] == [stats]


def test_statistics_of_an_unknown_model_are_404_in_v2_shape(proxy):
    with client(proxy) as c, pytest.raises(InferenceServerException) as failed:
        c.get_inference_statistics("nope")
    assert failed.value.status() == "404"
    assert 'no model named "nope"' in str(failed.value)
    answer = proxy.client.post("/v2/models/default/stats", json={})
    assert answer.status_code == 405 and "GET" in answer.headers["allow"]


def test_streams_count_as_requests_and_a_streaming_batch_as_it_first_answers(tmp_path):
    streamer = str(Path(__file__).parent / "workers" / "streamer.py")
    proxy = Corral(tmp_path, worker=streamer)
    try:
        sse = {"accept": "text/event-stream"}
        for item in ({"chunks": 3}, {"chunks": 2}, {"chunks": 2, "fail_after": 0}):
            proxy.post(item, headers=sse).read()
        stats = proxy.client.get("/v2/models/default/stats").json()["model_stats"][0]
    finally:
        proxy.stop()
    inference = stats["inference_stats"]
    # A stream that failed before its first chunk is a plain 500: the model's failure.
    assert (inference["success"]["count"], inference["fail"]["count"]) == (2, 1)
    assert stats["inference_count"] == 2
    batches = stats["batch_stats"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == 3
    assert sum(b["compute_infer"]["count"] for b in batches) == stats["execution_count"] >= 1


def test_a_request_refused_before_its_jobs_ran_is_the_model_s_failure(proxy):
    """A request the model refused (a v2 tensor of the wrong datatype, a compressed body, a
    native body that is no JSON) was in no count: only requests whose jobs ran were counted. A
    request that is no inference (a GET on infer) is in none."""
    header = {
        "inputs": [{"name": "X", "shape": [1, 3], "datatype": "INT8", "data": [1, 2, 3]}],
    }
    assert proxy.client.post("/v2/models/default/infer", json=header).status_code == 400
    gzip = {"content-encoding": "gzip", "connection": "close"}
    answer = proxy.client.post("/v2/models/default/infer", content=b"x", headers=gzip)
    assert answer.status_code == 415
    bad = {"content-type": "application/json"}
    assert proxy.client.post("/infer", content=b"{", headers=bad).status_code == 400
    assert proxy.client.get("/v2/models/default/infer").status_code == 405
    inference = stats_of(proxy)["inference_stats"]
    assert (inference["success"]["count"], inference["fail"]["count"]) == (0, 3)


def test_a_route_named_stats_is_warned_of(corral_factory, tmp_path):
    """v2's /v2/models/stats is every model's statistics: a model named so cannot be asked for
    there. Warned of, not refused: a file that started before keeps starting."""
    (tmp_path / "corral.toml").write_text(
        f'[stages.a]\ncommand = ["{sys.executable}", "{WORKER}"]\n'
        '[routes.stats]\npipeline = "a"\npath = "/infer"\n'
    )
    proxy = corral_factory("--config", str(tmp_path / "corral.toml"), worker=None)
    proxy.wait_for_log(r"route .stats.: Open Inference v2.s /v2/models/stats is the statistics")
    proxy.wait_for_log("worker connected")
    # Its infer still serves; /v2/models/stats answers every model's statistics.
    x, scale, words = rows(1)
    with client(proxy) as c:
        c.infer("stats", tensors(x, scale, words))
        (model,) = c.get_inference_statistics()["model_stats"]
    assert model["name"] == "stats" and model["inference_count"] == 1


def test_statistics_add_up_for_64_clients_of_large_rows(tmp_path):
    """At user sizes: 64 clients at once, each sending requests of 4 rows of 64 KiB text (batch
    frames of megabytes, far past a socket buffer). Every request and row is counted once, and
    the batches by size hold every row. (A deadline far past the default 5 s: on a loaded
    machine admission refused some at the default, which is not what this counts.)"""

    proxy = Corral(tmp_path, "--timeout-ms=120000", worker=WORKER)
    try:
        _statistics_add_up(proxy)
    finally:
        proxy.stop()


def _statistics_add_up(proxy) -> None:
    from concurrent.futures import ThreadPoolExecutor

    clients, requests, rows_each = 64, 3, 4
    text = b"t" * (64 * 1024)

    def send(n: int) -> int:
        x, scale, words = rows(rows_each, text)
        with client(proxy) as c:
            for _ in range(requests):
                answer = c.infer("default", tensors(x, scale, words))
                assert answer.as_numpy("UPPER")[0][0].startswith(b"T" * 1000)
        return n

    with ThreadPoolExecutor(clients) as pool:
        assert sorted(pool.map(send, range(clients))) == list(range(clients))
    stats = stats_of(proxy)
    inference = stats["inference_stats"]
    total = clients * requests
    assert (inference["success"]["count"], inference["fail"]["count"]) == (total, 0)
    assert inference["queue"]["count"] == inference["compute_infer"]["count"] == total
    assert stats["inference_count"] == total * rows_each
    batches = stats["batch_stats"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == total * rows_each
    assert sum(b["compute_infer"]["count"] for b in batches) == stats["execution_count"]
