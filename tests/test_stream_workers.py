"""Streaming workers written with the Python package (generator `forward`, `corral.END`,
`self.cancelled`, `max_running`) behind the real proxy, and the generation example."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

from conftest import ROOT
from test_streams import SSE, events, open_streams, stream_all

TOKENS = str(ROOT / "tests" / "workers" / "tokens.py")
GENERATE = str(ROOT / "examples" / "generate" / "worker.py")


def test_a_generator_worker_streams_each_item_its_own_tokens(corral_factory, tmp_path):
    proxy = corral_factory(worker=TOKENS, env={"TOKENS_CANCELS": str(tmp_path / "c")})
    gate = tmp_path / "gate"
    with proxy.client.stream(
        "POST", "/infer", json={"n": 3, "gate": str(gate)}, headers=SSE
    ) as response:
        received = events(response)
        assert next(received) == ("message", "t-0")
        gate.touch()  # the worker holds the rest until the test has the first token
        assert list(received) == [("message", "t-1"), ("message", "t-2"), ("done", {})]
    # A client that asks for one answer gets every token at once.
    assert proxy.post({"n": 2, "tag": "one"}).json() == ["one-0", "one-1"]


def test_a_generator_quiet_past_its_hung_limit_is_not_killed(corral_factory, tmp_path):
    # A 300 ms timeout gives the worker 1.3 s of silence mid-stream; the item waits at its gate
    # longer than that, its generator stepping with nothing to send. It was killed as hung, and
    # the stream ended worker_died; the package now sends a sign of life.
    proxy = corral_factory(
        "--timeout-ms=300", worker=TOKENS, env={"TOKENS_CANCELS": str(tmp_path / "c")}
    )
    gate = tmp_path / "gate"
    with proxy.client.stream(
        "POST", "/infer", json={"n": 2, "gate": str(gate)}, headers=SSE
    ) as response:
        received = events(response)
        assert next(received) == ("message", "t-0")
        time.sleep(2.0)  # the quiet spell itself, past the hung limit: no event marks its end
        gate.touch()
        assert list(received) == [("message", "t-1"), ("done", {})]
    assert proxy.metric("corral_worker_failures_total", stage="default", reason="hung") == 0


def test_a_client_leaving_reaches_the_generator_as_cancelled(corral_factory, tmp_path):
    cancels, gate = tmp_path / "cancels", tmp_path / "gate"
    proxy = corral_factory(
        "--batch-policy=fixed",
        "--max-batch-size=2",
        "--max-wait-ms=60000",
        worker=TOKENS,
        env={"TOKENS_CANCELS": str(cancels)},
    )
    leaving = {"n": 3, "gate": str(gate), "tag": "a"}
    staying = {"n": 3, "gate": str(gate), "tag": "b"}
    with ExitStack() as leaves, ExitStack() as stays:
        left, kept = open_streams(proxy, [leaving, staying], [leaves, stays])
        assert next(events(left)) == ("message", "a-0")
        leaves.close()
        proxy.wait_until(
            lambda: cancels.exists() and "a" in cancels.read_text().split(),
            what="self.cancelled in the worker",
        )
        gate.touch()
        assert [data for _, data in events(kept)] == ["b-0", "b-1", "b-2", {}]


def test_a_new_request_joins_a_running_generator(corral_factory, tmp_path):
    gate = tmp_path / "gate"
    proxy = corral_factory(
        worker=TOKENS, env={"TOKENS_MAX_RUNNING": "4", "TOKENS_CANCELS": str(tmp_path / "c")}
    )
    with proxy.client.stream(
        "POST", "/infer", json={"n": 3, "gate": str(gate), "tag": "long"}, headers=SSE
    ) as long_stream:
        long_events = events(long_stream)
        assert next(long_events) == ("message", "long-0")
        # The long stream holds the generator; a new one joins it and finishes meanwhile.
        _, received = stream_all(proxy, {"n": 2, "tag": "new"})
        assert received == [("message", "new-0"), ("message", "new-1"), ("done", {})]
        gate.touch()
        assert [data for _, data in long_events] == ["long-1", "long-2", {}]


def test_a_joining_worker_never_runs_more_than_max_running(corral_factory, tmp_path):
    """64 streams queued before the worker connects (as many clients as users send): with
    max_running = 2 it had been sent a full batch at once (bounded only by --max-batch-size),
    and ran them all."""
    proxy = corral_factory("--timeout-ms=60000", worker=None)
    peaks = tmp_path / "peaks"
    count = 64
    with ThreadPoolExecutor(count) as pool:
        streams = [pool.submit(stream_all, proxy, {"n": 3, "tag": f"s{i}"}) for i in range(count)]
        proxy.wait_until(lambda: proxy.metric("corral_queue_depth") == count, what="all queued")
        env = {
            **os.environ, "TOKENS_MAX_RUNNING": "2", "TOKENS_PEAKS": str(peaks),
            "TOKENS_CANCELS": str(tmp_path / "c"),
        }  # fmt: skip
        worker = subprocess.Popen([sys.executable, TOKENS, "--socket", str(proxy.socket)], env=env)
        try:
            for i, done in enumerate(streams):
                _, received = done.result(timeout=60)
                assert [data for _, data in received] == [f"s{i}-{k}" for k in range(3)] + [{}]
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    ran = [int(line) for line in peaks.read_text().split()]
    assert ran and max(ran) <= 2, ran


def test_the_generation_example_streams_characters(corral_factory):
    proxy = corral_factory(worker=GENERATE)
    request = {"prompt": "The ", "max_tokens": 12, "seed": 7}
    _, received = stream_all(proxy, request)
    assert [name for name, _ in received] == ["message"] * 12 + ["done"]
    text = "".join(data for _, data in received[:-1])
    # The same seed gives the same text to a client that asks for one answer.
    assert "".join(proxy.post(request).json()) == text

    def one(n: int) -> int:
        _, got = stream_all(proxy, {"prompt": f"{n} ", "max_tokens": 20})
        return len(got)

    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(one, range(16))) == [21] * 16


def test_the_generation_example_s_client_prints_the_text_or_corral_s_reason(corral_factory):
    # A request Corral refused ended in urllib's HTTPError traceback, its JSON message unread.
    proxy = corral_factory(worker=GENERATE)
    client = [sys.executable, str(ROOT / "examples" / "generate" / "client.py")]
    url = proxy.url + "/infer"
    done = subprocess.run([*client, "The ", "12", url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("The ") and len(done.stdout) == len("The ") + 12 + 1
    refused = subprocess.run(
        [*client, "The ", "0", url], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1
    assert "422 invalid_input" in refused.stderr and "max_tokens" in refused.stderr
    assert "Traceback" not in refused.stderr
    # Nothing listening: said so, not urllib's traceback either.
    gone = subprocess.run(
        [*client, "The ", "3", "http://127.0.0.1:1/infer"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gone.returncode == 1 and "cannot reach" in gone.stderr
    assert "Traceback" not in gone.stderr
