"""The examples, served for real: the digits classifier (make run's model), the typed worker, the
pipeline (scan → prepare → classify), and the embeddings example's request handling on both of
its routes (its own and OpenAI's), with a stand-in for its model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sklearn.datasets import load_digits

from conftest import ROOT

DIGITS = str(ROOT / "examples" / "digits" / "worker.py")


def test_digits_classifies_real_digits_in_batches(corral_factory):
    proxy = corral_factory(worker=DIGITS, workers=1)
    digits = load_digits()
    images = [{"pixels": row.tolist()} for row in digits.data[:40]]
    response = proxy.post(images, headers={"x-corral-items": "many"})
    assert response.status_code == 200, response.text
    answers = response.json()
    assert len(answers) == 40
    correct = sum(a["label"] == t for a, t in zip(answers, digits.target[:40]))
    assert correct >= 38
    for answer in answers:
        assert len(answer["probabilities"]) == 10
        assert abs(sum(answer["probabilities"]) - 1) < 1e-3
        assert answer["label"] == max(range(10), key=lambda k: answer["probabilities"][k])


def test_digits_sample_from_the_readme(corral_factory):
    proxy = corral_factory(worker=DIGITS, workers=1)
    sample = json.loads((ROOT / "examples" / "digits" / "sample.json").read_text())
    assert proxy.post(sample).json()["label"] == 0


def test_digits_rejects_malformed_images_alone(corral_factory):
    proxy = corral_factory(worker=DIGITS, workers=1)
    good = {"pixels": [0.0] * 64}
    short = {"pixels": [0.0] * 63}
    wrong_type = {"pixels": ["dark"] + [0.0] * 63}
    too_dark = {"pixels": [17.0] + [0.0] * 63}
    extra = {"pixels": [0.0] * 64, "colour": "blue"}
    response = proxy.post(
        [good, short, wrong_type, too_dark, extra], headers={"x-corral-items": "many"}
    )
    assert response.status_code == 422
    failed = {item["index"]: item["message"] for item in response.json()["items"]}
    assert set(failed) == {1, 2, 3, 4}
    assert "length >= 64" in failed[1] and "$.pixels" in failed[1]
    assert "$.pixels[0]" in failed[2]
    assert "<= 16" in failed[3]
    assert "colour" in failed[4]
    assert proxy.post(good).status_code == 200


def pipeline_example(corral_factory, tmp_path):
    """The pipeline example's own config, with its commands pointed at this checkout."""
    text = (ROOT / "examples" / "pipeline" / "corral.toml").read_text()
    text = text.replace('".venv/bin/python"', json.dumps(sys.executable))
    text = text.replace('"examples/', json.dumps(str(ROOT / "examples"))[:-1] + "/")
    config = tmp_path / "corral.toml"
    config.write_text(text)
    proxy = corral_factory("--config", str(config), worker=None)
    proxy.wait_for_log(r"worker connected", count=3)
    return proxy


def test_pipeline_example_reads_scans(corral_factory, tmp_path):
    proxy = pipeline_example(corral_factory, tmp_path)
    sample = json.loads((ROOT / "examples" / "pipeline" / "sample.json").read_text())
    assert proxy.post(sample).json()["label"] == 0
    digits = load_digits()
    scans = [
        {"image": [[round(255 - v * 255 / 16) for v in row] for row in image.tolist()]}
        for image in digits.images[:40]
    ]
    answers = proxy.post(scans, headers={"x-corral-items": "many"}).json()
    correct = sum(a["label"] == t for a, t in zip(answers, digits.target[:40]))
    assert correct >= 38
    paths = proxy.client.get("/openapi.json").json()["paths"]
    request = paths["/infer"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "Scan" in json.dumps(request), "the route takes what the first stage declares"


def test_pipeline_example_rejects_a_bad_scan_before_the_model(corral_factory, tmp_path):
    proxy = pipeline_example(corral_factory, tmp_path)
    answer = proxy.post({"image": [[0] * 8] * 7})
    assert answer.status_code == 422
    assert "$.image" in answer.json()["message"]
    assert proxy.post({"image": [[256] * 8] * 8}).status_code == 422
    assert proxy.metric("corral_batch_size_count", stage="classify") == 0


def embeddings_example(corral_factory, tmp_path):
    """The embeddings example's own config, its worker run with a stand-in model (no torch):
    tests/workers/fake_embeddings.py."""
    fake = ROOT / "tests" / "workers" / "fake_embeddings.py"
    text = (ROOT / "examples" / "embeddings" / "corral.toml").read_text()
    command = json.dumps([sys.executable, str(fake)])
    text = text.replace(
        '["examples/embeddings/.venv/bin/python", "examples/embeddings/worker.py"]', command
    )
    assert str(fake) in text, "the example's command line changed: update this test"
    config = tmp_path / "corral.toml"
    config.write_text(text)
    proxy = corral_factory("--config", str(config), worker=None)
    proxy.wait_for_log(r"worker connected")
    return proxy


def test_embeddings_example_serves_its_route_and_openai(corral_factory, tmp_path):
    import openai

    proxy = embeddings_example(corral_factory, tmp_path)
    # Corral's own route: {"text": ...} in, {"embedding": ...} out.
    assert proxy.post({"text": "hello"}).json() == {"embedding": [5.0, 1.0]}
    many = proxy.post([{"text": "ab"}, {"text": "abc"}], headers={"x-corral-items": "many"})
    assert [answer["embedding"][0] for answer in many.json()] == [2.0, 3.0]
    # OpenAI's route: each input string is a job whose payload is the bare string.
    # Closed as it goes out of use: an unclosed client's warning could fail another test.
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as client:
        answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=["ab", "abcd"])
        assert [d.embedding[0] for d in answer.data] == [2.0, 4.0]
        assert client.embeddings.create(model="m", input="hello").data[0].embedding[0] == 5.0


def test_embeddings_example_rejects_bad_requests_alone(corral_factory, tmp_path):
    import openai

    proxy = embeddings_example(corral_factory, tmp_path)
    answer = proxy.post(
        [{"text": "fine"}, {"text": ""}, {"txt": "typo"}, {"text": 3}],
        headers={"x-corral-items": "many"},
    )
    assert answer.status_code == 422
    assert [item["index"] for item in answer.json()["items"]] == [1, 2, 3]
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.UnprocessableEntityError) as raised:
            client.embeddings.create(model="m", input=["fine", "x" * 10_001])
    assert "input 1" in raised.value.message and "length <= 10000" in raised.value.message


@pytest.mark.parametrize(
    ("env", "device"),
    [
        ({}, "cpu"),
        ({"CORRAL_GPU": "1"}, "cuda"),
        ({"CORRAL_GPU": "1", "EMBEDDINGS_DEVICE": "cpu"}, "cpu"),
    ],
)
def test_embeddings_example_runs_where_corral_placed_it(env, device):
    """deploy/kubernetes/gpu-deployment.yaml spawns this worker with --gpus all: it had run its
    model on the CPU whatever device it was given."""
    code = "import worker; print(worker.device())"
    clean = {k: v for k, v in os.environ.items() if k not in ("CORRAL_GPU", "EMBEDDINGS_DEVICE")}
    ran = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "examples" / "embeddings",
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.strip() == device
