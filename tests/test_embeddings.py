"""The embeddings example (opt-in: `make test-embeddings`, which installs torch): the real model
behind the real proxy, answers compared with the same model run in this process."""

from __future__ import annotations

import math
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.embeddings
pytest.importorskip("sentence_transformers", reason="opt-in: run `make test-embeddings`")
sys.path.insert(0, str(ROOT / "examples" / "embeddings"))
import worker as embeddings  # noqa: E402  (the example's own model code)

WORKER = str(ROOT / "examples" / "embeddings" / "worker.py")
SENTENCES = [
    "A cat sits on the mat.",
    "A kitten is resting on a rug.",
    "The stock market fell sharply today.",
    "Corral gathers single requests into batches.",
]
# Embeddings shift by about 1e-7 with the batch they are computed in; compare with a margin.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model():
    return embeddings.load_model()


@pytest.fixture
def proxy(corral_factory):
    proxy = corral_factory(
        "--max-batch-size", "32", "--workers", "1", "--", sys.executable, WORKER, worker=None
    )
    proxy.wait_for_log(r"worker connected", timeout=300)  # torch and the model load first
    return proxy


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, abs_tol=TOLERANCE) for x, y in zip(a, b))


def test_embeddings_match_the_model_run_directly(proxy, model):
    expected = embeddings.embed(model, SENTENCES)
    one_by_one = [proxy.post({"text": s}).json()["embedding"] for s in SENTENCES]
    together = proxy.post([{"text": s} for s in SENTENCES], headers={"x-corral-items": "many"})
    assert together.status_code == 200, together.text
    for got in (one_by_one, [answer["embedding"] for answer in together.json()]):
        assert all(len(vector) == 384 for vector in got)
        assert all(close(a, b) for a, b in zip(got, expected))
    cat, kitten, stocks, _ = expected
    similarity = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    assert similarity(cat, kitten) > similarity(cat, stocks) + 0.2


def test_malformed_requests_are_rejected_alone(proxy):
    answer = proxy.post(
        [{"text": "fine"}, {"text": ""}, {"txt": "typo"}, {"text": 3}],
        headers={"x-corral-items": "many"},
    )
    assert answer.status_code == 422
    assert [item["index"] for item in answer.json()["items"]] == [1, 2, 3]
    assert proxy.post({"text": "fine"}).status_code == 200
