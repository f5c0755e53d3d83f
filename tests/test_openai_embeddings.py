"""OpenAI embeddings end to end: the real `openai` package's `client.embeddings.create` against a
route declaring `protocol = "openai-embeddings"`, served by tests/workers/embed.py (8 floats per
text from its hash, the last one the size of its batch)."""

import base64
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from openapi_spec_validator import validate

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from embed import vector

EMBED = str(Path(__file__).parent / "workers" / "embed.py")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    from conftest import Corral

    tmp_path = tmp_path_factory.mktemp("openai")
    (tmp_path / "corral.toml").write_text(
        # A batch of 4 leaves the moment it is full; the long wait keeps a smaller one from
        # leaving early, so 4 inputs admitted together can only travel as one batch.
        "max_body_bytes = 4096\n"
        "[stages.embed]\n"
        f'command = ["{sys.executable}", "{EMBED}"]\n'
        "max_batch_size = 4\n"
        "max_wait_ms = 2000\n"
        "[routes.embed]\n"
        'pipeline = "embed"\n'
        'protocol = "openai-embeddings"\n'
    )
    corral = Corral(tmp_path, "--config", str(tmp_path / "corral.toml"), worker=None)
    corral.wait_for_log(r"worker connected")
    yield corral
    corral.stop()


@pytest.fixture
def client(proxy):
    # No retries: a test wants the first answer, and the package retries 408s and 5xxs.
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client  # closed after the test: an unclosed client's socket is a ResourceWarning


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_a_list_of_strings_shares_a_batch(client, encoding_format):
    texts = ["one", "two words", "three more words", "four"]
    answer = client.embeddings.create(model="hash-8", input=texts, encoding_format=encoding_format)
    assert [d.index for d in answer.data] == [0, 1, 2, 3]
    embeddings = [d.embedding for d in answer.data]
    if encoding_format == "base64":
        # Asked for explicitly, base64 is handed over as is: decode it as the package does
        # when it asks for base64 itself (little-endian float32).
        embeddings = [np.frombuffer(base64.b64decode(e), dtype="<f4").tolist() for e in embeddings]
    assert embeddings == [vector(text, 4) for text in texts]
    assert answer.model == "hash-8"
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (7, 7)


def test_the_package_default_is_base64_and_a_single_string_works(client, proxy):
    # The package asks for base64 unless told otherwise: this is what most callers send.
    answer = client.embeddings.create(model="m", input="hello")
    assert answer.data[0].embedding == vector("hello", 1)
    raw = proxy.client.post("/v1/embeddings", json={"model": "m", "input": "hello"}).json()
    assert raw["object"] == "list"
    assert raw["data"] == [{"object": "embedding", "index": 0, "embedding": vector("hello", 1)}]


def test_openapi_documents_the_protocols_and_validates(proxy):
    document = proxy.client.get("/openapi.json").json()
    validate(document)
    assert {"/embed", "/v1/embeddings", "/v1/models/{name}:predict"} <= set(document["paths"])


def test_the_route_keeps_its_own_path(proxy):
    answer = proxy.client.post("/embed", json="hello")
    assert answer.json() == vector("hello", 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input": []}, "input must not be empty"),
        ({"input": [[1, 2, 3]]}, "token arrays are not supported"),
        ({"input": [1, 2, 3]}, "token arrays are not supported"),
        ({"input": ["a", 1]}, "input 1 is not a string"),
        # Tokens are whole numbers: a float is no token array, only not a string.
        ({"input": [1.5]}, "input 0 is not a string"),
        ({"input": [[1.5, 2]]}, "input 0 is not a string"),
        # The field, then serde's words: no second prefix between them.
        ({"input": "x", "user": 7}, "user is not valid: invalid type: integer `7`"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format must be"),
        ({"input": "x", "dimensions": 8}, "dimensions is not supported"),
    ],
)
def test_bad_requests_are_400_in_openai_shape(client, kwargs, message):
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model="m", **kwargs)
    assert raised.value.status_code == 400
    assert message in raised.value.message
    assert raised.value.type == "invalid_request_error"
    assert raised.value.code == "bad_request"
    # Each of these is about one field, which `param` names.
    fields = [field for field in ("encoding_format", "dimensions", "user") if field in kwargs]
    assert raised.value.param == (fields[0] if fields else "input")


def test_nan_and_infinity_come_back_in_base64_and_are_refused_as_json_floats(client):
    # JSON has no NaN nor infinity: written as null they would reach the client as no number.
    answer = client.embeddings.create(model="m", input="not finite", encoding_format="base64")
    values = np.frombuffer(base64.b64decode(answer.data[0].embedding), dtype="<f4")
    assert np.isnan(values[0]) and list(values[1:]) == [np.inf, -np.inf, 0.5]
    with pytest.raises(openai.InternalServerError) as raised:
        client.embeddings.create(model="m", input=["fine", "not finite"], encoding_format="float")
    assert raised.value.code == "unrepresentable_output"
    assert "input 1 holds NaN or infinity" in raised.value.message
    assert 'encoding_format "base64"' in raised.value.message


def test_the_package_is_told_not_to_retry_an_answer_the_same_input_gets_again(proxy):
    # With its default of two retries the package sent a worker's output that JSON cannot carry
    # three times, running the work three times: it retries every 5xx unless `x-should-retry:
    # false` says otherwise.
    failures = lambda: proxy.metric("corral_requests_total", code="500")  # noqa: E731
    before = failures()
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused") as retrying:
        assert retrying.max_retries == 2
        with pytest.raises(openai.InternalServerError) as raised:
            retrying.embeddings.create(model="m", input="not finite", encoding_format="float")
    assert raised.value.code == "unrepresentable_output"
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert failures() == before + 1


@pytest.mark.parametrize("encoding_format", ["base64", "float"])
def test_a_finite_number_past_float32s_range_is_the_workers_fault(client, encoding_format):
    # As float32 it would be an infinity: a base64 client (the openai package's default) got
    # `inf` with a 200 for the worker's 1e39, a float client a 500 blaming NaN or infinity.
    with pytest.raises(openai.InternalServerError) as raised:
        client.embeddings.create(model="m", input="past float32", encoding_format=encoding_format)
    assert raised.value.code == "bad_output"
    assert "input 0 holds 1e39, past float32's range" in raised.value.message


def test_floats_are_written_as_float32_in_openai_s_order(proxy):
    """OpenAI's embeddings are float32, written in the shortest form that reads back to the same
    float32 (as OpenAI and TEI write them), not widened to float64's 17 digits; keys come in the
    order OpenAI's own answers have them."""
    body = {"model": "m", "input": "tenths", "encoding_format": "float"}
    answer = proxy.client.post("/v1/embeddings", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.text == (
        '{"object":"list","data":[{"object":"embedding","index":0,'
        '"embedding":[0.1,0.2,0.33333334]}],'
        '"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}'
    )
    # Read back as float32, the worker's values.
    embedding = np.array(answer.json()["data"][0]["embedding"], dtype=np.float32)
    assert embedding.tolist() == np.array([0.1, 0.2, 1 / 3], dtype=np.float32).tolist()


def test_raw_bytes_from_the_worker_are_a_bad_output_not_an_embedding(client):
    # Read as the list of its bytes they would be a vector of byte values, with a 200.
    with pytest.raises(openai.InternalServerError) as raised:
        client.embeddings.create(model="m", input=["fine", "raw bytes"], encoding_format="float")
    assert raised.value.code == "bad_output"
    assert "input 1 is not a list of numbers" in raised.value.message


def test_a_byte_order_mark_is_named_not_taken_for_a_body_that_is_no_object(proxy):
    # It had been told "the body must be a JSON object" of a body that is one.
    answer = proxy.client.post(
        "/v1/embeddings",
        content=b'\xef\xbb\xbf{"model": "m", "input": "x"}',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert "begins with a byte order mark" in answer.json()["error"]["message"]


def test_a_body_in_another_encoding_is_told_so(proxy):
    # serde's "invalid unicode code point" had said nothing of why; with a charset naming the
    # encoding it is 415, as on every route.
    body = '{"model": "m", "input": "café"}'.encode("latin1")
    named = {"content-type": "application/json; charset=latin1"}
    answer = proxy.client.post("/v1/embeddings", content=body, headers=named)
    assert answer.status_code == 415, answer.text
    assert "charset=latin1, but JSON is UTF-8" in answer.json()["error"]["message"]
    plain = {"content-type": "application/json"}
    answer = proxy.client.post("/v1/embeddings", content=body, headers=plain)
    assert answer.status_code == 400, answer.text
    assert "it is not UTF-8, which JSON is" in answer.json()["error"]["message"]
    # In a field the request does not read too (it had been served).
    unread = '{"model": "m", "input": "x", "extra": "café"}'.encode("latin1")
    answer = proxy.client.post("/v1/embeddings", content=unread, headers=named)
    assert answer.status_code == 415, answer.text


@pytest.mark.parametrize("media_type", ["application/msgpack", "text/plain"])
def test_a_body_not_json_is_415_saying_json_only(proxy, media_type):
    # Any other type was told "application/json or application/msgpack", and msgpack is then
    # refused here.
    answer = proxy.client.post(
        "/v1/embeddings", content=b"\x80", headers={"content-type": media_type}
    )
    assert answer.status_code == 415
    assert answer.json()["error"]["message"] == (
        "Content-Type must be application/json: OpenAI's API is JSON only"
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "m"}, "input"),
        ({"input": "a"}, "model"),
        ({"input": "a", "model": 5}, "model"),
        ({"input": "a", "model": "m", "encoding_format": 5}, "encoding_format"),
        ({"input": "a", "model": "m", "user": 5}, "user"),
    ],
)
def test_a_field_serde_cannot_read_is_named_in_param(proxy, body, field):
    # A missing field, or one of the wrong type, had come back with `param: null` (README:
    # `param` names the field a client error is about); a `user` that is no string was served.
    answer = proxy.client.post("/v1/embeddings", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == field, error
    missing = field not in body
    said = f"{field} is required: missing field" if missing else f"{field} is not valid: "
    assert error["message"].startswith(said), error
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [["hello world", "m", "float", None], [1], "hello", 3])
def test_a_body_that_is_not_an_object_is_400(proxy, body):
    # serde reads a struct from an array of its fields too: ["text", "model", ...] was served.
    answer = proxy.client.post("/v1/embeddings", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "bad_request"
    assert error["message"] == "the body must be a JSON object: an embeddings request"


def test_an_input_the_worker_rejects_is_422_naming_it(client):
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.embeddings.create(model="m", input=["fine", "reject me"])
    assert "input 1: cannot embed 'reject me'" in raised.value.message
    assert raised.value.code == "invalid_input"
    assert raised.value.param == "input"


def test_an_oversized_input_is_413(client):
    with pytest.raises(openai.APIStatusError) as raised:
        client.embeddings.create(model="m", input="x" * 5000)
    assert raised.value.status_code == 413
    assert "larger than 4096 bytes" in raised.value.message
    assert raised.value.code == "body_too_large"


def test_the_timeout_header_is_read(proxy):
    answer = proxy.client.post(
        "/v1/embeddings",
        json={"model": "m", "input": "x"},
        headers={"x-corral-timeout-ms": "nope"},
    )
    assert answer.status_code == 400
    assert "x-corral-timeout-ms" in answer.json()["error"]["message"]


def test_an_openai_path_no_route_serves_is_404_in_openai_shape(proxy, corral_factory):
    # In Corral's own shape, the openai package showed only "Error code: 404 - not_found".
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as error:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert error.value.body["message"] == "no route for /v1/chat/completions"
    plain = corral_factory()  # no route declares the protocol
    with openai.OpenAI(base_url=plain.url + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as error:
            client.embeddings.create(model="m", input="x")
    assert 'protocol = "openai-embeddings"' in error.value.body["message"]


def declaring_proxy(
    corral_factory, tmp_path, max_batch_size: int = 4, inputs: str = "", full_only: bool = True
):
    """A proxy whose route `embed` (the OpenAI one) is served by embed.py declaring tensors
    (or, with `inputs`, the environment that makes it declare other inputs); its batches leave
    only when full, unless `full_only` is off (the default policy then)."""
    policy = 'batch_policy = "fixed"\n' if full_only else ""
    (tmp_path / "corral.toml").write_text(
        policy + "[stages.embed]\n"
        f'command = ["{sys.executable}", "{EMBED}"]\n'
        f"max_batch_size = {max_batch_size}\n"
        + ("max_wait_ms = 60000\n" if full_only else "")
        + f'env = {{ EMBED_TENSORS = "1", EMBED_INPUTS = "{inputs}" }}\n'
        + "[routes.embed]\n"
        'pipeline = "embed"\n'
        'protocol = "openai-embeddings"\n'
    )
    proxy = corral_factory("--config", str(tmp_path / "corral.toml"), worker=None)
    proxy.wait_for_log(r"worker connected")
    return proxy


def test_a_worker_declaring_tensors_serves_openai_and_v2_clients_in_one_batch(
    corral_factory, tmp_path
):
    # Each string goes as the lone BYTES input's row, the embedding is read from the numeric
    # output; a v2 client's rows ride in the same batch. (Sent as bare strings, every embeddings
    # request had failed 500, and so had the v2 rows batched with them.)
    import tritonclient.http as triton

    proxy = declaring_proxy(corral_factory, tmp_path, max_batch_size=3)
    texts = ["one", "two words"]
    v2 = triton.InferenceServerClient(proxy.url.removeprefix("http://"))
    text = triton.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"three"]], dtype=object))
    with (
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as client,
        ThreadPoolExecutor(2) as pool,
    ):
        embedded = pool.submit(client.embeddings.create, model="m", input=texts)
        inferred = pool.submit(v2.infer, "embed", [text])
        answer, v2_answer = embedded.result(), inferred.result()
        # A full batch of 3: it goes at once.
        as_floats = client.embeddings.create(model="m", input=list("xyz"), encoding_format="float")
    v2.close()
    assert [d.embedding for d in answer.data] == [vector(t, 3) for t in texts]
    assert v2_answer.as_numpy("EMBEDDING").tolist() == [vector("three", 3)]
    assert [d.embedding for d in as_floats.data] == [vector(t, 3) for t in "xyz"]


def test_a_worker_declaring_inputs_no_string_can_be_is_a_500_saying_so(corral_factory, tmp_path):
    proxy = declaring_proxy(corral_factory, tmp_path, inputs="FP32")
    answer = proxy.client.post("/v1/embeddings", json={"model": "m", "input": "x"})
    assert answer.status_code == 500
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == ("unsupported_model", "server_error")
    assert "one BYTES input of one element" in error["message"]


def test_before_any_worker_connected_an_embeddings_request_is_503_with_retry_after(
    corral_factory, tmp_path
):
    # What a string becomes is not known yet: queued as a bare string, it would reach a worker
    # that declares tensors.
    (tmp_path / "corral.toml").write_text(
        '[stages.outside]\n[routes.embed]\npipeline = "outside"\nprotocol = "openai-embeddings"\n'
    )
    proxy = corral_factory("--config", str(tmp_path / "corral.toml"), worker=None)
    answer = proxy.client.post("/v1/embeddings", json={"model": "m", "input": "x"})
    assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
    assert answer.json()["error"]["code"] == "not_ready"


def test_64_openai_and_v2_clients_of_4_kib_strings_share_a_declaring_worker(
    corral_factory, tmp_path
):
    # At the sizes users send: 48 OpenAI clients of 16 strings of 4 KiB each and 16 v2 clients
    # of as many rows, at once, in batches of 32 (frames of 128 KiB, past a socket's buffer).
    # Every embedding is the one of its own string (the last element is the batch's size).
    import tritonclient.http as triton

    proxy = declaring_proxy(corral_factory, tmp_path, max_batch_size=32, full_only=False)
    texts = [[f"client {c} input {i} " + "w" * 4096 for i in range(16)] for c in range(64)]

    def over_openai(strings):
        with openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0) as c:
            return [d.embedding for d in c.embeddings.create(model="m", input=strings).data]

    def over_v2(strings):
        c = triton.InferenceServerClient(proxy.url.removeprefix("http://"))
        rows = triton.InferInput("TEXT", [len(strings), 1], "BYTES")
        rows.set_data_from_numpy(np.array([[t.encode()] for t in strings], dtype=object))
        try:
            return c.infer("embed", [rows]).as_numpy("EMBEDDING").tolist()
        finally:
            c.close()

    with ThreadPoolExecutor(64) as pool:
        jobs = [pool.submit(over_openai if c < 48 else over_v2, texts[c]) for c in range(64)]
        answers = [job.result() for job in jobs]
    for strings, embeddings in zip(texts, answers):
        assert [e[:-1] for e in embeddings] == [vector(t, 1)[:-1] for t in strings]
