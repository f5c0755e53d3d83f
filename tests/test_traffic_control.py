"""Who goes first and how much fits, end to end: priority classes (overtaking, eviction answered
`preempted` at once, promotion by waiting), tenants (fair turns, their share of the queue), and
weight budgets (the client's `x-corral-weight`, the worker's declared rule).

Every test builds its queue deterministically: the `gated` worker holds a first batch (an item
`{"hold": true}`) until the test opens the gate, so the jobs sent meanwhile queue up; the test
waits on the proxy's own queue gauges before it opens the gate, and then reads the order the
worker ran things in from its log. No sleeps, no timing assertions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import BINARY, ROOT, Corral
from corral import _protocol as protocol

GATED = str(ROOT / "tests" / "workers" / "gated.py")


class Gated:
    """A proxy with one gated worker, and helpers to fill its queue."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None):
        self.gate = tmp_path / "gate"
        self.log = tmp_path / "batches.jsonl"
        env = {"GATED_GATE": str(self.gate), "GATED_LOG": str(self.log), **(env or {})}
        self.proxy = Corral(tmp_path, *args, worker=GATED, env=env)
        self.pool = ThreadPoolExecutor(64)
        self.held = self.send({"id": "hold", "hold": True})
        self.proxy.wait_until(
            lambda: self.proxy.metric("corral_workers_busy", stage="default") == 1,
            what="the worker holding the first batch",
        )

    def send(self, item: dict, headers: dict[str, str] | None = None, path: str = "/infer"):
        """Posts one item from another thread; returns its future response."""
        return self.pool.submit(self.proxy.client.post, path, json=item, headers=headers or {})

    def queued(self, cls: str) -> float:
        return self.proxy.metric("corral_queue_depth_by_class", stage="default", **{"class": cls})

    def wait_queued(self, cls: str, count: int) -> None:
        self.proxy.wait_until(lambda: self.queued(cls) >= count, what=f"{count} {cls} jobs queued")

    def open(self) -> None:
        self.gate.touch()

    def batches(self) -> list[list[str]]:
        """The ids of each batch the worker ran, in order (the held one first)."""
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def order(self) -> list[str]:
        return [id_ for batch in self.batches() for id_ in batch]

    def stop(self) -> None:
        self.open()
        self.pool.shutdown(wait=True)
        self.proxy.stop()


@pytest.fixture
def gated(tmp_path):
    started: list[Gated] = []

    def start(*args: str, **kwargs) -> Gated:
        proxy = Gated(tmp_path / f"proxy{len(started)}", *args, **kwargs)
        started.append(proxy)
        return proxy

    for i in range(3):
        (tmp_path / f"proxy{i}").mkdir()
    yield start
    for proxy in started:
        proxy.stop()


def priority(cls: str) -> dict[str, str]:
    return {"x-corral-priority": cls}


def test_high_jobs_overtake_a_queue_of_low_ones(gated):
    proxy = gated("--max-batch-size=2", "--max-wait-ms=0")
    lows = [proxy.send({"id": f"low{i}"}, priority("low")) for i in range(6)]
    proxy.wait_queued("low", 6)
    highs = [proxy.send({"id": f"high{i}"}, priority("high")) for i in range(2)]
    proxy.wait_queued("high", 2)
    proxy.open()
    assert all(f.result().status_code == 200 for f in lows + highs + [proxy.held])
    batches = proxy.batches()
    assert batches[0] == ["hold"]
    assert sorted(batches[1]) == ["high0", "high1"], batches
    assert all(id_.startswith("low") for batch in batches[2:] for id_ in batch)


def test_eviction_answers_preempted_at_once_and_admits_the_high_job(gated):
    proxy = gated("--queue-capacity=4", "--max-batch-size=8", "--timeout-ms=60000")
    # Four low jobs fill the queue, each with a later deadline than the one before.
    lows = []
    for i in range(4):
        timeout = {"x-corral-timeout-ms": str(20_000 + i * 1000)}
        lows.append(proxy.send({"id": f"low{i}"}, {**priority("low"), **timeout}))
        proxy.wait_queued("low", i + 1)
    full = proxy.send({"id": "low4"}, priority("low")).result()
    assert full.status_code == 503, "a low job evicts nothing"
    assert full.json()["error"] == "queue_full"
    high = proxy.send({"id": "high"}, priority("high"))
    # The low job with the latest deadline is answered while the worker is still held.
    evicted = lows[3].result(timeout=30)
    assert evicted.status_code == 503
    assert evicted.json()["error"] == "preempted"
    assert int(evicted.headers["retry-after"]) >= 1
    assert not proxy.gate.exists()
    proxy.wait_queued("high", 1)
    assert proxy.proxy.metric("corral_jobs_evicted_total", stage="default", **{"class": "low"}) == 1
    proxy.open()
    assert high.result().status_code == 200
    assert [f.result().status_code for f in lows[:3]] == [200, 200, 200]
    assert proxy.order()[:2] == ["hold", "high"]
    assert "low3" not in proxy.order(), "an evicted job never reaches a worker"


def test_a_waiting_low_job_is_promoted_and_not_starved(gated):
    # Aging 1 s: a low job competes as normal after 1 s and as high after 2 s of "high-before"
    # being queued above it (it waits for a busy worker alone before that, and does not age).
    proxy = gated("--max-batch-size=1", "--max-wait-ms=0", "--priority-aging-ms=1000")
    low = proxy.send({"id": "low"}, priority("low"))
    proxy.wait_queued("low", 1)
    early = proxy.send({"id": "high-before"}, priority("high"))
    # The proxy promotes as time passes: wait for it to show the low job as high.
    proxy.wait_queued("high", 2)
    assert proxy.queued("low") == 0
    late = [proxy.send({"id": f"high-after{i}"}, priority("high")) for i in range(3)]
    proxy.wait_queued("high", 5)
    proxy.open()
    assert all(f.result().status_code == 200 for f in [low, early, *late])
    # Once promoted, it goes before every high job that arrived after its promotion.
    assert proxy.order()[:3] == ["hold", "high-before", "low"], proxy.order()


def test_a_flooding_tenant_does_not_starve_a_quiet_one(gated):
    proxy = gated("--max-batch-size=8", "--max-wait-ms=0", "--queue-capacity=1024")

    async def burst():
        limits = httpx.Limits(max_connections=256)
        async with httpx.AsyncClient(base_url=proxy.proxy.url, timeout=60, limits=limits) as client:

            async def one(tenant: str, i: int):
                headers = {"x-corral-tenant": tenant}
                return await client.post("/infer", json={"id": f"{tenant}{i}"}, headers=headers)

            flood = [asyncio.create_task(one("flood", i)) for i in range(200)]
            # The gauge has no event of its own: wait_queued polls it, up to its deadline, in a
            # thread, while this loop goes on sending the requests.
            await asyncio.to_thread(proxy.wait_queued, "normal", 200)
            quiet = [asyncio.create_task(one("quiet", i)) for i in range(4)]
            await asyncio.to_thread(proxy.wait_queued, "normal", 204)
            proxy.open()
            return await asyncio.gather(*flood, *quiet)

    answers = asyncio.run(burst())
    assert all(a.status_code == 200 for a in answers)
    batches = proxy.batches()[1:]
    first_two = [id_ for batch in batches[:2] for id_ in batch]
    assert {f"quiet{i}" for i in range(4)} <= set(first_two), batches[:3]
    # A tenant alone still fills whole batches: the flood's later batches are full.
    assert all(len(batch) == 8 for batch in batches[2:-1]), [len(b) for b in batches]


def test_a_tenant_over_its_share_of_the_queue_is_shed(gated):
    proxy = gated("--queue-capacity=8", "--tenant-queue-share=0.25", "--tenant-header=x-api-key")
    mine = [proxy.send({"id": f"a{i}"}, {"x-api-key": "key-a"}) for i in range(2)]
    proxy.wait_queued("normal", 2)
    over = proxy.send({"id": "a2"}, {"x-api-key": "key-a"}).result()
    assert over.status_code == 503
    assert over.json()["error"] == "tenant_quota"
    assert int(over.headers["retry-after"]) >= 1
    other = proxy.send({"id": "b0"}, {"x-api-key": "key-b"})
    proxy.wait_queued("normal", 3)
    shed = proxy.proxy.metric(
        "corral_jobs_shed_total", reason="tenant_quota", **{"class": "normal"}
    )
    assert shed == 1
    # The tenant's value is never a label nor logged.
    assert "key-a" not in proxy.proxy.client.get("/metrics").text
    proxy.open()
    assert [f.result().status_code for f in [*mine, other]] == [200, 200, 200]
    assert not any("key-a" in line for line in proxy.proxy.lines)


def test_a_tenant_holding_nothing_may_place_one_request_larger_than_its_share(gated):
    # Refused, it would be refused on every retry: Retry-After would promise what never comes.
    proxy = gated("--queue-capacity=8", "--tenant-queue-share=0.25")
    tenant = {"x-corral-tenant": "a", "x-corral-items": "many"}
    three = [{"id": f"a{i}"} for i in range(3)]  # the share is 2 jobs
    first = proxy.send(three, tenant)
    proxy.wait_queued("normal", 3)
    # Holding jobs, the tenant is held to its share again.
    second = proxy.send([{"id": "a3"}], tenant).result()
    assert (second.status_code, second.json()["error"]) == (503, "tenant_quota")
    proxy.open()
    answer = first.result()
    assert answer.status_code == 200, answer.text
    assert [item["id"] for item in answer.json()] == ["a0", "a1", "a2"]


@pytest.mark.parametrize("clients", [1, 64])
@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_queued_jobs_whose_clients_left_leave_the_queue_at_once_as_cancelled(
    gated, clients, accept
):
    # 64 clients leave within a few purges' limit (10 ms each): every one of their jobs leaves
    # all the same. A client that asked for a stream waits on its first chunk: the same holds.
    proxy = gated("--timeout-ms=60000")  # deadlines far past this test's waits
    body = json.dumps({"id": "gone"}).encode()
    host, port = proxy.proxy.url.removeprefix("http://").split(":")
    with contextlib.ExitStack() as leaving:
        for _ in range(clients):
            client = leaving.enter_context(socket.create_connection((host, int(port))))
            client.sendall(
                b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                + f"accept: {accept}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                + body
            )
        proxy.wait_queued("normal", clients)
    # The clients hung up before their answers. Their jobs are gone from the queue, and
    # counted, while the worker still holds its batch: not left to count as expired when
    # their deadline comes.
    proxy.proxy.wait_until(lambda: proxy.queued("normal") == 0, what="the jobs to leave")
    assert proxy.proxy.metric("corral_jobs_cancelled_total", where="queue") == clients
    proxy.open()
    assert proxy.held.result().status_code == 200
    assert proxy.order() == ["hold"]
    assert proxy.proxy.metric("corral_jobs_expired_total", where="queue") == 0


def weight_sums(batches: list[list[str]], weights: dict[str, int]) -> list[int]:
    return [sum(weights[id_] for id_ in batch) for batch in batches]


def test_every_batch_keeps_to_the_weight_budget(gated):
    proxy = gated("--max-batch-size=32", "--max-batch-weight=10", "--max-wait-ms=0")
    weights = {f"w{i}": w for i, w in enumerate([3, 4, 5, 2, 15, 1, 6, 4, 9, 1, 1, 8])}
    futures = []
    for id_, weight in weights.items():
        futures.append(proxy.send({"id": id_}, {"x-corral-weight": str(weight)}))
        proxy.wait_queued("normal", len(futures))
    proxy.open()
    assert all(f.result().status_code == 200 for f in futures)
    batches = proxy.batches()[1:]
    for batch, total in zip(batches, weight_sums(batches, weights)):
        assert total <= 10 or batch == ["w4"], (batch, total)
    assert ["w4"] in batches, "the item heavier than the budget went alone"
    assert sorted(id_ for b in batches for id_ in b) == sorted(weights)


# Items of these pad lengths: each job's payload (msgpack) is its pad plus 15 bytes or so.
PADS = {f"b{i}": n for i, n in enumerate([300, 400, 500, 200, 2500, 100, 600, 900])}
# The batches a 1,000-byte budget makes of them: a batch ends before the job that would pass the
# budget, and the 2,500-byte job goes alone.
BY_BYTES = [["b0", "b1"], ["b2", "b3"], ["b4"], ["b5", "b6"], ["b7"]]


def queue_padded(proxy: Gated) -> list[list[str]]:
    """Queues the PADS items behind the held batch, runs them, and returns their batches."""
    futures = []
    for id_, n in PADS.items():
        futures.append(proxy.send({"id": id_, "pad": "x" * n}))
        proxy.wait_queued("normal", len(futures))
    proxy.open()
    assert all(f.result().status_code == 200 for f in futures), "a job over the budget too"
    return proxy.batches()[1:]


def test_every_batch_keeps_to_the_byte_budget(gated):
    proxy = gated("--max-batch-size=32", "--max-batch-bytes=1000", "--max-wait-ms=0")
    assert queue_padded(proxy) == BY_BYTES


def test_a_stage_takes_its_byte_budget_from_the_config_file(gated, tmp_path):
    config = tmp_path / "budget.toml"
    config.write_text("max_batch_bytes = 100000\n[stages.default]\nmax_batch_bytes = 1000\n")
    proxy = gated("--max-batch-size=32", "--max-wait-ms=0", f"--config={config}")
    assert queue_padded(proxy) == BY_BYTES, "the stage's key, not the top level's"


def test_a_request_of_several_items_is_not_split_by_the_byte_budget(gated):
    proxy = gated("--max-batch-size=32", "--max-batch-bytes=1000", "--max-wait-ms=0")
    first = proxy.send({"id": "a", "pad": "x" * 500})
    proxy.wait_queued("normal", 1)
    items = [{"id": f"r{i}", "pad": "x" * 300} for i in range(2)]
    many = proxy.pool.submit(
        proxy.proxy.client.post, "/infer", json=items, headers={"x-corral-items": "many"}
    )
    proxy.wait_queued("normal", 3)
    proxy.open()
    assert first.result().status_code == 200 and many.result().status_code == 200
    assert proxy.batches()[1:] == [["a"], ["r0", "r1"]], "the request waited to go whole"


def test_the_workers_weight_rule_weighs_items(gated):
    proxy = gated(
        "--max-batch-size=32", "--max-batch-weight=10", "--max-wait-ms=0",
        env={"GATED_WEIGHT_RULE": "/text"},
    )  # fmt: skip
    texts = {f"t{i}": "x" * n for i, n in enumerate([4, 4, 4, 7, 3, 12, 1])}
    futures = []
    for id_, text in texts.items():
        futures.append(proxy.send({"id": id_, "text": text}))
        proxy.wait_queued("normal", len(futures))
    proxy.open()
    assert all(f.result().status_code == 200 for f in futures)
    batches = proxy.batches()[1:]
    lengths = {id_: len(text) for id_, text in texts.items()}
    for batch, total in zip(batches, weight_sums(batches, lengths)):
        assert total <= 10 or batch == ["t5"], (batch, total)
    assert len(batches) >= 4, "lengths, not counts, bounded the batches"


@pytest.mark.parametrize(
    "header, value",
    [
        ("x-corral-priority", "urgent"),
        ("x-corral-priority", ""),
        ("x-corral-weight", "0"),
        ("x-corral-weight", "-2"),
        ("x-corral-weight", "heavy"),
    ],
)
def test_a_bad_traffic_header_is_a_400_naming_it(corral_factory, header, value):
    proxy = corral_factory()
    answer = proxy.post({"x": 1}, headers={header: value})
    assert answer.status_code == 400
    assert answer.json()["message"].startswith(header)
    # Answered before the body was read: the connection is not reused.
    assert answer.headers["connection"] == "close"
    # The same holds on the protocols' paths.
    v1 = proxy.client.post(
        "/v1/models/default:predict", json={"instances": [1]}, headers={header: value}
    )
    assert v1.status_code == 400 and header in v1.json()["error"]


@pytest.mark.parametrize(
    "header, first, second",
    [
        ("x-corral-priority", "high", "low"),
        ("x-corral-tenant", "client", "gateway"),
        ("x-corral-weight", "1", "7"),
    ],
)
def test_a_traffic_header_given_twice_with_different_values_is_a_400(
    corral_factory, header, first, second
):
    """Only the first field had been read: a gateway appending its own value after the
    client's (Envoy's default) was ignored, and a tenant field a client put first escaped its
    tenant's quota. (Folded into one field, a priority or weight does not parse, a 400; a
    tenant so folded is a tenant of that name, as the README says.)"""
    proxy = corral_factory()
    answer = proxy.post({"x": 1}, headers=[(header, first), (header, second)])
    assert answer.status_code == 400, answer.text
    message = f"{header} is given more than once, with different values"
    assert answer.json()["message"] == message
    alike = proxy.post({"x": 1}, headers=[(header, first), (header, first)])
    assert alike.status_code == 200, alike.text


def test_a_routes_default_priority_applies_without_the_header(tmp_path):
    config = tmp_path / "corral.toml"
    config.write_text(
        f"""
        [stages.default]
        command = ["{sys.executable}", "{GATED}"]
        [routes.interactive]
        path = "/infer"
        pipeline = "default"
        [routes.scoring]
        path = "/score"
        pipeline = "default"
        priority = "LOW"  # any case, as the header's
        """
    )
    gate, log = tmp_path / "gate", tmp_path / "log"
    env = {"GATED_GATE": str(gate), "GATED_LOG": str(log)}
    proxy = Corral(tmp_path, "--config", str(config), "--max-batch-size=1", worker=None, env=env)
    try:
        proxy.wait_for_log("worker connected")
        pool = ThreadPoolExecutor(8)
        held = pool.submit(proxy.client.post, "/infer", json={"id": "hold", "hold": True})
        proxy.wait_until(lambda: proxy.metric("corral_workers_busy", stage="default") == 1)
        scored = pool.submit(proxy.client.post, "/score", json={"id": "scored"})

        def depth(cls):
            return proxy.metric("corral_queue_depth_by_class", stage="default", **{"class": cls})

        proxy.wait_until(lambda: depth("low") == 1, what="the scoring job queued as low")
        asked = pool.submit(
            proxy.client.post, "/score", json={"id": "asked"}, headers=priority("high")
        )
        proxy.wait_until(lambda: depth("high") == 1, what="the header overriding the route")
        plain = pool.submit(proxy.client.post, "/infer", json={"id": "plain"})
        proxy.wait_until(lambda: depth("normal") == 1)
        gate.touch()
        assert all(f.result().status_code == 200 for f in [held, scored, asked, plain])
        order = [json.loads(line)[0] for line in log.read_text().splitlines()]
        assert order == ["hold", "asked", "plain", "scored"]
        pool.shutdown()
    finally:
        proxy.stop()


def test_a_worker_declaring_a_bad_weight_rule_is_refused(corral_factory):
    proxy = corral_factory(worker=None)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(proxy.socket))
    hello = {**protocol.hello("default", 4242, "bad-rule"), "weight": "text"}
    sock.sendall(protocol.encode_frame(hello))
    reply = protocol.read_frame(sock.makefile("rb"))
    assert reply["type"] == "reject"
    assert "JSON Pointer" in reply["message"]
    sock.close()


@pytest.mark.parametrize(
    "args, config, expected",
    [
        (["--tenant-queue-share", "0"], None, "is not a share above 0 and at most 1"),
        (["--tenant-queue-share", "1.5"], None, "is not a share above 0 and at most 1"),
        (["--max-batch-weight", "0"], None, "--max-batch-weight"),
        (["--max-batch-bytes", "0"], None, "--max-batch-bytes"),
        (["--max-batch-bytes", "67108864"], None, "error: --max-batch-bytes: 67108864 is not in"),
        ([], "[stages.s]\nmax_batch_bytes = 67108864\n", "stages.s.max_batch_bytes"),
        # The top level's value, too large for this stage's batches: named as the top level's.
        (
            [],
            "max_batch_bytes = 67000000\n[stages.s]\nmax_batch_size = 4096\n",
            "toml: max_batch_bytes",
        ),
        (["--tenant-header", "bad header"], None, "is not a valid HTTP header name"),
        ([], "tenant_queue_share = 0.0\n", "tenant_queue_share"),
        ([], 'tenant_header = "a b"\n', "tenant_header"),
        # The client's request id, logged with its request: a tenant's value never is.
        (
            [],
            'tenant_header = "X-Request-Id"\n',
            "tenant_header: x-request-id is a header Corral reads for something else",
        ),
        (["--tenant-header", "x-request-id"], None, "x-request-id is a header Corral reads"),
        (["--tenant-header", "Content-Encoding"], None, "content-encoding is a header Corral"),
        (["--tenant-header", "transfer-encoding"], None, "transfer-encoding is a header Corral"),
        # HTTP/2 carries it as :authority: its clients had no tenant, and no quota.
        (["--tenant-header", "Host"], None, "host is a header Corral reads for something else"),
        ([], 'tenant_header = "cookie"\n', "tenant_header: cookie cannot name a tenant"),
        (["--tenant-header", "Upgrade"], None, "upgrade cannot name a tenant: it is a connection"),
        ([], 'tenant_header = "te"\n', "tenant_header: te cannot name a tenant"),
        ([], "[stages.s]\nmax_batch_weight = 0\n", "stages.s.max_batch_weight"),
        ([], '[stages.s]\n[routes.r]\npipeline = "s"\npriority = "urgent"\n', "priority"),
    ],
)
def test_traffic_settings_that_cannot_work_are_refused_at_start(tmp_path, args, config, expected):
    command = [BINARY, "--listen", "127.0.0.1:0", "--socket", str(tmp_path / "s.sock"), *args]
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        command += ["--config", str(tmp_path / "c.toml")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr, result.stderr
    assert "listening" not in result.stderr
