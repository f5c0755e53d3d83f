"""Streaming workers (a generator ``forward``) against the fake proxy over a real socket pair:
chunks as they come, END, cancellation, deadlines, failures, joining a running generator, and
plain workers unchanged."""

import functools
import os
import socket
import threading
import time
from pathlib import Path

import msgpack
import pytest

import corral
from corral import _protocol as protocol
from corral import _streaming
from corral.testing import FakeProxy, Result, Stream

WAIT = 10  # seconds an Event may take before the test fails (a hang guard, not a timing)
VECTORS = Path(__file__).resolve().parents[2] / "worker-protocol" / "vectors"


class Spell(corral.Worker):
    """Streams each word one letter per step; a word that runs out yields None."""

    def forward(self, words):
        for step in range(max(len(w) for w in words)):
            yield [w[step] if step < len(w) else None for w in words]


class Joining(corral.Worker):
    """Each item is a word streamed one letter per step, then ended; items join between steps.
    The first items ("long" ones) hold their last letter until a joined item has ended, so the
    joined one provably streams while they are still running."""

    max_running = 4

    def __init__(self):
        self.joined_batches = []

    def forward(self, words):
        words = list(words)
        sent = [0] * len(words)
        ended = [False] * len(words)
        first = len(words)
        while not all(ended):
            step = [None] * len(words)
            some_joined_ended = any(ended[first:])
            for p, word in enumerate(words):
                if ended[p] or p in self.cancelled:
                    ended[p] = True
                    continue
                if sent[p] < len(word) - 1 or (
                    sent[p] == len(word) - 1 and (p >= first or some_joined_ended)
                ):
                    step[p] = word[sent[p]]
                    sent[p] += 1
                elif sent[p] == len(word):
                    step[p] = corral.END
                    ended[p] = True
            new = yield step
            if new:
                self.joined_batches.append(list(new))
            words += new
            sent += [0] * len(new)
            ended += [False] * len(new)


def test_a_streaming_worker_declares_stream_and_cancel_and_a_plain_one_nothing():
    class Plain(corral.Worker):
        def forward(self, batch):
            return batch

    with FakeProxy(Spell()) as proxy:
        assert proxy.hello["features"] == ["stream", "cancel"]
    with FakeProxy(Joining()) as proxy:
        assert proxy.hello["features"] == ["stream", "cancel", "join"]
    with FakeProxy(Plain()) as proxy:
        # Only shared memory (the proxy's test double sends no `shm` frame: the worker goes on).
        assert proxy.hello["features"] == ["shm"]
        assert list(proxy.hello) == ["type", "version", "stage", "pid", "name", "features"]
        assert [r.value for r in proxy.infer([1])] == [1]


def test_a_decorated_generator_forward_still_streams():
    # Served as a plain worker, each step would be taken for one item's output: with as many
    # steps as items, clients would get each other's letters.
    def logged(forward):
        @functools.wraps(forward)
        def wrapper(self, batch):
            return forward(self, batch)

        return wrapper

    class Decorated(corral.Worker):
        @logged
        def forward(self, words):
            for step in range(max(len(w) for w in words)):
                yield [w[step] if step < len(w) else None for w in words]

    with FakeProxy(Decorated()) as proxy:
        assert proxy.hello["features"] == ["stream", "cancel"]
        assert proxy.stream(["ab", "cd"]) == [Stream(["a", "b"], "end"), Stream(["c", "d"], "end")]

    # A generator wrapper around a plain forward streams its steps, as it did before.
    def stepped(forward):
        @functools.wraps(forward)  # its __wrapped__ is the plain function
        def wrapper(self, batch):
            for step in forward(self, batch):  # noqa: UP028 (yield from would pass send on)
                yield step

        return wrapper

    class Stepped(corral.Worker):
        @stepped
        def forward(self, words):
            return [[w[0] for w in words], [w[1] for w in words]]

    with FakeProxy(Stepped()) as proxy:
        assert proxy.stream(["ab", "cd"]) == [Stream(["a", "b"], "end"), Stream(["c", "d"], "end")]


def test_a_generator_forward_set_on_the_instance_streams_as_its_hello_says():
    # The hello read the instance and the batches the class: declared `stream`, served plain.
    class Configured(corral.Worker):
        def __init__(self):
            self.forward = self.spell

        def spell(self, words):
            for step in range(max(len(w) for w in words)):
                yield [w[step] if step < len(w) else None for w in words]

    with FakeProxy(Configured()) as proxy:
        assert proxy.hello["features"] == ["stream", "cancel"]
        assert proxy.stream(["ab", "c"]) == [Stream(["a", "b"], "end"), Stream(["c"], "end")]


def test_max_running_set_on_the_instance_is_the_one_declared():
    # The hello read the class (no join) while the streams read the instance (pulls): the
    # proxy took the pulls for a broken protocol.
    class Configured(Joining):
        max_running = None

        def __init__(self, room):
            super().__init__()
            self.max_running = room

    with FakeProxy(Configured(4)) as proxy:
        assert proxy.hello["features"] == ["stream", "cancel", "join"]
        # So that no fresh batch brings more than it runs at once.
        assert proxy.hello["max_batch"] == 4
    with FakeProxy(Configured(None)) as proxy:
        assert proxy.hello["features"] == ["stream", "cancel"]
        assert "max_batch" not in proxy.hello


def test_hello_features_come_last_in_the_documented_order():
    golden = (VECTORS / "hello_stream.bin").read_bytes()
    hello = protocol.hello("generate", 4243, "Generate", features=["stream", "cancel", "join"])
    assert protocol.encode_frame(hello) == golden


def test_each_item_gets_exactly_its_own_chunks_in_order():
    with FakeProxy(Spell()) as proxy:
        got = proxy.stream(["hello", "ab", "", "xyz"])
        assert got == [
            Stream(list("hello"), "end"),
            Stream(["a", "b"], "end"),
            Stream([], "end"),
            Stream(list("xyz"), "end"),
        ]
        # One chunks frame per step, carrying every item that had a chunk.
        assert proxy.events[1:4] == [("chunk", 0, "h"), ("chunk", 1, "a"), ("chunk", 3, "x")]
        # The worker goes on serving batches.
        assert proxy.stream(["ok"]) == [Stream(["o", "k"], "end")]


def test_one_yield_goes_out_as_one_chunks_frame():
    with FakeProxy(Spell()) as proxy:
        jobs = [
            protocol.job(bytes([i]) * 16, 5000, msgpack.packb(w)) for i, w in [(1, "ab"), (2, "c")]
        ]
        proxy.send(protocol.batch(jobs))
        first = proxy.receive()
        assert first == protocol.chunks(
            [
                protocol.chunk(b"\1" * 16, msgpack.packb("a")),
                protocol.chunk(b"\2" * 16, msgpack.packb("c")),
            ]
        )
        assert proxy.receive() == protocol.chunks([protocol.chunk(b"\1" * 16, msgpack.packb("b"))])
        assert proxy.receive() == protocol.results(
            [protocol.end(b"\1" * 16), protocol.end(b"\2" * 16)]
        )


def test_chunks_arrive_before_the_generator_goes_on():
    go_on = threading.Event()

    class Waits(corral.Worker):
        def forward(self, batch):
            yield ["first"] * len(batch)
            # The proxy must have the first chunk before this returns: only then is go_on set.
            assert go_on.wait(WAIT)
            yield ["second"] * len(batch)

    def on_chunk(index, value):
        if value == "first":
            go_on.set()

    with FakeProxy(Waits()) as proxy:
        assert proxy.stream([1], on_chunk=on_chunk) == [Stream(["first", "second"], "end")]


def test_end_closes_one_item_at_once_while_the_others_go_on():
    release = threading.Event()

    class Ends(corral.Worker):
        def forward(self, batch):
            yield ["a0", "b0"]
            yield [corral.END, "b1"]
            assert release.wait(WAIT)  # set once the proxy has item 0's end
            yield ["dropped", "b2"]  # item 0 is over: its entry is ignored

    with FakeProxy(Ends()) as proxy:
        original = proxy.receive

        def receive():
            message = original()
            if message and message["type"] == "results":
                release.set()
            return message

        proxy.receive = receive
        got = proxy.stream(["x", "y"])
        assert got == [Stream(["a0"], "end"), Stream(["b0", "b1", "b2"], "end")]
        ends = [e for e in proxy.events if e[0] == "end"]
        assert ends == [("end", 0, "end"), ("end", 1, "end")]
        assert proxy.events.index(("end", 0, "end")) < proxy.events.index(("chunk", 1, "b2"))


def test_a_cancel_shows_in_cancelled_and_its_later_chunks_are_not_sent():
    class Records(corral.Worker):
        def __init__(self):
            self.seen = []

        def forward(self, batch):
            yield ["a1", "b1"]
            yield ["a2", "b2"]
            steps = 0
            while 1 not in self.cancelled:  # the cancel is read by the reader thread
                steps += 1
                yield [f"a-wait{steps}", None]
            self.seen = sorted(self.cancelled)
            yield ["a-last", "b-late"]  # b's chunk is dropped

    worker = Records()
    with FakeProxy(worker) as proxy:
        a, b = proxy.stream(["x", "y"], cancel_after={1: 2})
        assert worker.seen == [1]
        assert b == Stream(["b1", "b2"], "end")
        assert a.chunks[:2] == ["a1", "a2"] and a.chunks[-1] == "a-last" and a.status == "end"
        # Item 1 was ended as soon as its cancel was seen, before the generator returned.
        assert proxy.events.index(("end", 1, "end")) < proxy.events.index(("chunk", 0, "a-last"))


def test_a_deadline_passing_before_the_first_chunk_shows_in_cancelled(monkeypatch):
    offset = [0.0]
    monkeypatch.setattr(_streaming, "_now", lambda: time.monotonic() + offset[0])

    class Late(corral.Worker):
        def __init__(self):
            self.seen = None

        def forward(self, batch):
            yield ["a1", None]  # item 1 has no chunk yet
            offset[0] = 3600.0  # an hour passes: both deadlines are behind us
            yield ["a2", None]
            self.seen = set(self.cancelled)
            yield ["a3", "b-late"]

    worker = Late()
    with FakeProxy(worker) as proxy:
        a, b = proxy.stream(["x", "y"])
    # Item 0 streams: its deadline only bounded its first chunk. Item 1 never started.
    assert worker.seen == {1}
    assert a == Stream(["a1", "a2", "a3"], "end")
    assert b.chunks == [] and b.status == "expired" and "deadline" in b.message


def test_a_generator_raising_ends_the_remaining_items_with_an_error_and_the_worker_lives_on():
    class Breaks(corral.Worker):
        def forward(self, batch):
            if len(batch) == 1:
                yield ["fine"]
                return
            yield ["a1", "b1", "c1"]
            yield [corral.END, "b2", None]
            raise ValueError("the model fell over")

    with FakeProxy(Breaks()) as proxy:
        a, b, c = proxy.stream([1, 2, 3])
        assert a == Stream(["a1"], "end")
        assert b.chunks == ["b1", "b2"] and b.status == "error"
        assert "ValueError: the model fell over" in b.message
        assert c.chunks == ["c1"] and c.status == "error"
        assert proxy.stream([7]) == [Stream(["fine"], "end")]
        assert proxy.worker_error is None


def test_a_wrong_length_yield_fails_the_items_not_ended():
    class Short(corral.Worker):
        def forward(self, batch):
            yield ["a", "b"]
            yield ["c"]

    with FakeProxy(Short()) as proxy:
        got = proxy.stream([1, 2])
        assert [s.status for s in got] == ["error", "error"]
        assert "1 entry for 2 items" in got[0].message
        assert got[0].chunks == ["a"]


def test_postprocess_applies_to_each_chunk_and_a_failing_chunk_ends_only_its_item():
    class Shouts(corral.Worker):
        def __init__(self):
            self.cancelled_seen = None

        def forward(self, batch):
            yield ["a", "b"]
            yield ["c", 13]
            self.cancelled_seen = set(self.cancelled)
            yield ["d", "e"]

        def postprocess(self, chunk):
            if chunk == 13:
                raise ValueError("unlucky chunk")
            return {"text": chunk.upper()}

    worker = Shouts()
    with FakeProxy(worker) as proxy:
        a, b = proxy.stream([1, 2])
    assert a == Stream([{"text": "A"}, {"text": "C"}, {"text": "D"}], "end")
    assert b.chunks == [{"text": "B"}] and b.status == "error" and "unlucky chunk" in b.message
    assert worker.cancelled_seen == {1}


def test_a_chunks_postprocess_sees_its_own_items_deadline_and_media_type():
    seen = []

    class Tagged(corral.Worker):
        def forward(self, batch):
            yield ["a", "b"]

        def postprocess(self, chunk):
            seen.append((chunk, self.content_type, self.deadline != float("inf")))
            return chunk

    with FakeProxy(Tagged()) as proxy:
        proxy.stream([b"x", 1], content_type=["text/plain", None])
    assert seen == [("a", "text/plain", True), ("b", None, True)]


def test_a_patched_base_postprocess_is_called_per_chunk(monkeypatch):
    """A spy on ``Worker.postprocess`` is the worker's own hook: it runs for each chunk."""
    calls = []
    original = corral.Worker.postprocess
    monkeypatch.setattr(
        corral.Worker, "postprocess", lambda self, out: calls.append(out) or original(self, out)
    )
    with FakeProxy(Spell()) as proxy:
        (word,) = proxy.stream(["ab"])
    assert word == Stream(["a", "b"], "end")
    assert calls == ["a", "b"]


def test_preprocess_failures_are_answered_before_the_stream_and_never_reach_forward():
    class Picky(Spell):
        def preprocess(self, item):
            if not isinstance(item, str):
                raise corral.ValidationError("want text")
            return item

        def forward(self, words):
            assert all(isinstance(w, str) for w in words)
            yield from super().forward(words)

    with FakeProxy(Picky()) as proxy:
        a, b = proxy.stream(["hi", 5])
        assert a == Stream(["h", "i"], "end")
        assert b == Stream([], "invalid", "want text")
        assert proxy.events[1] == ("end", 1, "invalid")


def test_a_new_item_joins_a_running_generator_and_streams_while_the_first_ones_go_on():
    worker = Joining()
    with FakeProxy(worker) as proxy:
        got = proxy.stream(["abc", "de"], join=["xy"])
        assert got == [
            Stream(list("abc"), "end"),
            Stream(list("de"), "end"),
            Stream(list("xy"), "end"),
        ]
        assert worker.joined_batches == [["xy"]]
        events = proxy.events
        # The offer came from the running generator, and the joined item's stream ended while
        # the first items still had a letter to send.
        assert events.index(("pull", 2)) < events.index(("batch", [2]))
        assert events.index(("end", 2, "end")) < events.index(("chunk", 0, "c"))
        assert events.index(("end", 2, "end")) < events.index(("chunk", 1, "e"))
        # One offer at a time: room for 2, then (the batch took one) for 1, never answered;
        # it lapsed when the last items ended (a worker holding no job is idle).
        assert proxy.pulls == [2, 1]


def test_a_standing_offer_is_withdrawn_before_the_last_results():
    class Once(corral.Worker):
        max_running = 4

        def forward(self, batch):
            yield ["only"] * len(batch)

    with FakeProxy(Once()) as proxy:
        assert proxy.stream(["a"]) == [Stream(["only"], "end")]
        assert proxy.pulls == [3, 0]
        assert proxy.events[-2:] == [("pull", 0), ("end", 0, "end")]


def test_an_offer_never_exceeds_the_room_and_joined_items_line_up_with_their_positions():
    class Counts(corral.Worker):
        max_running = 3

        def __init__(self):
            self.most_running = 0

        def forward(self, batch):
            items = list(batch)
            left = [2] * len(items)  # chunks to go; 0: END next; -1: over
            while any(n >= 0 for n in left):
                step = [
                    corral.END if n == 0 else (f"{items[p]}{n}" if n > 0 else None)
                    for p, n in enumerate(left)
                ]
                left = [n - 1 if n >= 0 else -1 for n in left]
                new = yield step
                items += new
                left += [2] * len(new)
                self.most_running = max(self.most_running, sum(n >= 0 for n in left))

    worker = Counts()
    with FakeProxy(worker) as proxy:
        got = proxy.stream(["a", "b"], join=["c", "d", "e", "f"])
        assert [s.status for s in got] == ["end"] * 6
        assert [s.chunks for s in got] == [[f"{w}2", f"{w}1"] for w in "abcdef"]
        assert proxy.pulls[0] == 1
        assert all(0 <= m <= 3 for m in proxy.pulls)
        assert worker.most_running <= 3


def test_no_pull_without_max_running_and_queued_items_come_as_a_new_batch():
    with FakeProxy(Spell()) as proxy:
        got = proxy.stream(["ab"], join=["c"])
        assert got == [Stream(["a", "b"], "end"), Stream(["c"], "end")]
        assert proxy.pulls == []
        assert ("batch", [1]) in proxy.events


def test_infer_on_a_streaming_worker_returns_the_chunk_list():
    with FakeProxy(Spell()) as proxy:
        assert proxy.infer(["abc", "d"]) == [
            Result("ok", value=["a", "b", "c"]),
            Result("ok", value=["d"]),
        ]


def test_stream_on_a_plain_worker_gives_its_answer_as_one_chunk():
    class Echo(corral.Worker):
        def forward(self, batch):
            return batch

    with FakeProxy(Echo()) as proxy:
        assert proxy.stream([1, "two"]) == [Stream([1], "end"), Stream(["two"], "end")]


def test_a_generator_forward_that_returns_its_outputs_fails_saying_so():
    """A stray `yield` makes forward a generator: its `return outputs` was dropped, and every
    client answered 200 with no chunk (`[]`), nothing logged."""

    class Stray(corral.Worker):
        def forward(self, batch):
            if False:
                yield
            return [x * 2 for x in batch]

    with FakeProxy(Stray()) as proxy:
        (got,) = proxy.infer([1])
    assert got.status == "error" and "returned a value, list [2]" in got.message
    warmed = Stray()
    warmed.examples = (1,)
    with pytest.raises(TypeError, match="forward is a generator"):
        warmed.warm_up()


def test_a_generator_returning_a_value_after_every_item_ended_fails_nobody(caplog):
    """With every item ended, the value fails no one: a failure with no jobs had been logged."""

    class Ended(corral.Worker):
        def forward(self, batch):
            yield [corral.END for _ in batch]
            return "unseen"

    with caplog.at_level("ERROR", logger="corral"), FakeProxy(Ended()) as proxy:
        (got,) = proxy.infer([1])
    assert got.status == "ok"
    assert not [r for r in caplog.records if "failed for jobs" in r.getMessage()]


def test_warm_up_runs_a_streaming_forward_through_postprocess():
    class Warm(Spell):
        examples = ("hi",)

        def postprocess(self, chunk):
            if chunk == "i":
                raise ValueError("no i")
            return chunk

    with pytest.raises(ValueError, match="no i"):
        Warm().warm_up()
    Spell().warm_up()


def test_end_is_one_object_with_a_readable_name():
    import pickle

    assert repr(corral.END) == "corral.END"
    assert pickle.loads(pickle.dumps(corral.END)) is corral.END
    assert type(corral.END)() is corral.END


def test_chunks_over_the_frame_limit_split_and_a_chunk_too_large_alone_is_left_out():
    entries = [protocol.chunk(bytes([i]) * 16, b"\xc4\x10" + b"x" * 16) for i in range(4)]
    (one,), too_large = protocol.encode_chunks(entries)
    assert one == protocol.encode_frame(protocol.chunks(entries)) and too_large == []
    frames, too_large = protocol.encode_chunks(entries, limit=100)
    assert too_large == [] and len(frames) > 1
    assert [e for f in frames for e in protocol.decode_body(f[4:])["chunks"]] == entries
    big = protocol.chunk(b"\x09" * 16, b"y" * 200)
    frames, too_large = protocol.encode_chunks([entries[0], big, entries[1]], limit=100)
    assert too_large == [1]
    assert [e for f in frames for e in protocol.decode_body(f[4:])["chunks"]] == entries[:2]


def test_a_shutdown_while_a_joining_worker_streams_closes_the_generator_and_stops_it():
    closed = threading.Event()

    class Forever(corral.Worker):
        max_running = 2

        def forward(self, batch):
            try:
                yield ["started"]
                while True:
                    yield [None]
            finally:
                closed.set()

    with FakeProxy(Forever()) as proxy:
        proxy.send(protocol.batch([protocol.job(b"\1" * 16, 5000, msgpack.packb(1))]))
        assert proxy.receive()["type"] == "chunks"
        proxy.send(protocol.shutdown("stopping"))
        while proxy.receive() is not None:  # the pull, then the end of the connection
            pass
        assert closed.wait(WAIT)
    assert isinstance(proxy.worker_error, SystemExit) and proxy.worker_error.code == 0


def test_a_plain_worker_ignores_a_cancel_and_a_malformed_cancel_is_a_protocol_error():
    class Echo(corral.Worker):
        def forward(self, batch):
            return batch

    with FakeProxy(Echo()) as proxy:
        proxy.send(protocol.cancel([b"\1" * 16]))
        assert proxy.infer([5]) == [Result("ok", value=5)]
        proxy.send({"type": "cancel", "ids": "nope"})
        assert proxy.receive() is None
    assert isinstance(proxy.worker_error, corral.ProtocolError)


def test_a_workers_own_helper_methods_do_not_replace_the_packages():
    class Helpers(corral.Worker):
        def forward(self, batch):
            return [self.process(self._answer(x)) for x in self._prepare(batch)]

        def _answer(self, x):
            return x + 1

        def _prepare(self, batch):
            return batch

        def process(self, x):  # a common name for a helper: it once replaced the serve loop's
            return x

    with FakeProxy(Helpers()) as proxy:
        assert proxy.infer([1, 2]) == [Result("ok", value=2), Result("ok", value=3)]


def test_a_decorated_generator_forward_that_raises_before_streaming_fails_its_batch_only():
    """A wrapper (functools.wraps) may raise before it returns the generator: once that took the
    worker process down, and the next worker with it on the retry."""

    def checked(forward):
        @functools.wraps(forward)
        def wrapper(self, batch):
            if "bad" in batch:
                raise ValueError("bad batch")
            return forward(self, batch)

        return wrapper

    class Checked(corral.Worker):
        @checked
        def forward(self, words):
            yield [w.upper() for w in words]

    with FakeProxy(Checked()) as proxy:
        [failed] = proxy.stream(["bad"])
        assert failed.status == "error" and "ValueError: bad batch" in failed.message
        assert proxy.stream(["ok"]) == [Stream(["OK"], "end")]
    assert proxy.worker_error is None


def test_max_running_set_after_the_hello_never_makes_a_pull_without_join():
    """The hello declared no `join`; a pull then is a protocol error to the proxy."""

    class Late(corral.Worker):
        def forward(self, items):
            self.max_running = 8  # sized once the model is loaded, say
            yield [None] * len(items)
            yield [corral.END] * len(items)

    with FakeProxy(Late()) as proxy:
        assert "join" not in proxy.hello["features"]
        for item in ("x", "y"):
            proxy.stream([item])
        assert proxy.pulls == []
    assert proxy.worker_error is None


def test_a_cancel_for_a_queued_batch_is_kept_for_the_run_that_takes_it():
    """A worker that does not join may still be in its last generator when the proxy, seeing
    every job ended, sends the next batch and then a cancel for it: that run's steps take the
    cancel, and once threw it away (the proxy tells a worker once)."""
    from corral import _serve

    proxy, worker = socket.socketpair()
    reader = _serve._Reader(worker, track_cancels=True)
    queued = protocol.job(b"q" * 16, 5000, msgpack.packb(1))
    proxy.sendall(protocol.encode_frame(protocol.batch([queued])))
    proxy.sendall(protocol.encode_frame(protocol.cancel([b"q" * 16, b"gone" * 4])))
    taken: set[bytes] = set()
    deadline = time.monotonic() + WAIT
    while not taken and time.monotonic() < deadline:
        taken = reader.take_cancelled()  # the running generator's step
        time.sleep(0.001)  # polled as a generator's steps do; the reader thread gets the GIL
    assert taken == {b"q" * 16, b"gone" * 4}
    reader.keep_cancelled(taken)  # neither is the running generator's
    assert reader.next()["jobs"][0]["id"] == b"q" * 16  # the next run takes the batch...
    assert reader.take_cancelled() == {b"q" * 16}  # ...and its cancel; the unknown id is gone
    proxy.close()
    reader.stop()
    worker.close()


def test_the_readmes_spelling_worker_drops_what_follows_a_cancel():
    """README's joining example, run as its text says: item 1 is cancelled after its first
    chunk, so its stream holds that chunk alone, as a client of the proxy would have seen; the
    worker may have made the next step before the cancel reached it (the package then sends it,
    and the fake proxy drops it as the proxy does)."""

    class ReadmeSpell(corral.Worker):
        max_running = 16

        def forward(self, words):
            words, sent = list(words), [0] * len(words)
            while any(n <= len(w) for n, w in zip(sent, words)):
                step = [None] * len(words)
                for p, w in enumerate(words):
                    if p in self.cancelled:
                        sent[p] = len(w) + 1
                    elif sent[p] <= len(w):
                        step[p] = w[sent[p]] if sent[p] < len(w) else corral.END
                        sent[p] += 1
                new = yield step
                words += new
                sent += [0] * len(new)

    with FakeProxy(ReadmeSpell()) as proxy:
        abc, de, xy = proxy.stream(["abc", "de"], join=["xy"], cancel_after={1: 1})
    assert (abc, de, xy) == (
        Stream(list("abc"), "end"),
        Stream(["d"], "end"),
        Stream(["x", "y"], "end"),
    )
    assert proxy.events.count(("cancel", 1)) == 1  # not again for each chunk dropped


class OfferingLink:
    """The proxy's side of a joining run, for `_streaming.run`: a new job of one item answers
    each standing offer, at once."""

    def __init__(self):
        self.offers = []
        self.owed = 0
        self.ended = 0  # results sent

    def send(self, frame):
        message = msgpack.unpackb(frame[4:])
        if message["type"] == "pull":
            self.offers.append(message["max"])
            self.owed = message["max"]

    def send_results(self, results):
        self.ended += len(results)

    def take_cancelled(self):
        return set()

    def keep_cancelled(self, ids):
        list(ids)

    def batches(self, count):
        return [[protocol.job(os.urandom(16), 60_000, msgpack.packb("x"))] for _ in range(count)]

    def take_batches(self):
        owed, self.owed = self.owed, 0
        return self.batches(owed)


@pytest.mark.parametrize("positions", [0, _streaming.MAX_POSITIONS])
def test_a_joining_run_takes_a_bounded_number_of_positions_then_ends(monkeypatch, positions):
    """Under steady traffic a joining generator never returned on its own: each job it ever
    took kept a position, and each step walked them all. Past its bound (16 x max_running, 64,
    with MAX_POSITIONS at 0; the real 4,096 otherwise) a run offers no more room, so its
    streams finish and it returns; the proxy's next batch starts a new run from position 0."""
    monkeypatch.setattr(_streaming, "MAX_POSITIONS", positions)
    bound = max(positions, 16 * 4)

    class Steady(corral.Worker):
        max_running = 4

        def forward(self, items):
            live, positions = list(range(len(items))), len(items)
            while live:
                out = [None] * positions
                out[live.pop(0)] = corral.END  # the oldest ends; the others stream on
                for p in live:
                    out[p] = "x"
                new = yield out
                live += range(positions, positions + len(new))
                positions += len(new)
            self.positions = positions

    link, worker = OfferingLink(), Steady()
    jobs = [protocol.job(os.urandom(16), 60_000, msgpack.packb("x")) for _ in range(4)]
    _streaming.run(worker, jobs, link, _streaming.limit(worker))
    assert worker.positions == bound
    assert sum(link.offers) == bound - len(jobs)  # none past the bound


def test_a_joining_feed_that_never_returns_is_closed_past_its_positions(monkeypatch):
    """A joining generator written as a loop that never returns (a feed taking whatever
    joins) is never "done": once it held no job, the proxy sent it a batch as to any idle
    worker, the run took it in, and past the bound its positions grew without end. Past the
    bound, holding no job, it is given one step to return, then closed; the batch the proxy
    sent is left for the serve loop (the next run)."""
    monkeypatch.setattr(_streaming, "MAX_POSITIONS", 0)
    bound = 16 * 4

    class Link(OfferingLink):  # ...and a batch to a worker holding no job
        taken = 4

        def take_batches(self):
            owed, self.owed = self.owed, 0
            if not owed and self.taken == self.ended:
                owed = 1  # idle in the proxy's eyes: it sends a batch anyway
            self.taken += owed
            assert self.taken < 10 * bound, "the run never ended"
            return self.batches(owed)

    class Feed(corral.Worker):
        max_running = 4

        def forward(self, items):
            items, done = list(items), set()
            self.closed = False
            try:
                while True:
                    out = [None] * len(items)
                    for p in range(len(items)):
                        if p not in done:
                            out[p] = corral.END
                            done.add(p)
                    items += yield out
            finally:
                self.closed = True
                self.positions = len(items)

    link, worker = Link(), Feed()
    jobs = [protocol.job(os.urandom(16), 60_000, msgpack.packb("x")) for _ in range(4)]
    _streaming.run(worker, jobs, link, _streaming.limit(worker))
    assert worker.closed
    assert bound <= worker.positions < bound + 4  # the last batch may take it past by its size
    assert link.ended == worker.positions  # every job it took was answered


def test_a_forward_that_changes_its_run_s_lists_fails_its_batch_not_the_worker():
    class Meddles(corral.Worker):
        def forward(self, words):
            yield [w[0] for w in words]
            self.deadlines.pop()  # the run's own list: its next step indexed past its end
            yield [w[1] for w in words]

    with FakeProxy(Meddles()) as proxy:
        ab, cd = proxy.stream(["ab", "cd"])
        assert (ab.chunks, ab.status, cd.status) == (["a"], "error", "error")
        assert "IndexError" in ab.message
        assert proxy.stream(["ok"])[0].status == "error"  # the worker lives on: still meddling


def test_a_quiet_generator_tells_the_proxy_it_is_alive(monkeypatch):
    # The proxy's hung clock counts from the worker's last frame: a generator whose steps
    # yielded nothing for longer than a route's timeout plus a second was killed as hung.
    monkeypatch.setattr(_streaming, "HEARTBEAT", 0.0)  # every quiet step, for the test
    release = threading.Event()

    class Quiet(corral.Worker):
        def forward(self, batch):
            yield ["first"] * len(batch)
            while not release.is_set():
                yield [None] * len(batch)  # waiting on something: nothing to say
            yield [corral.END] * len(batch)

    job_id = b"\1" * 16
    with FakeProxy(Quiet()) as proxy:
        proxy.send(protocol.batch([protocol.job(job_id, 5000, msgpack.packb("x"))]))
        assert proxy.receive() == protocol.chunks([protocol.chunk(job_id, msgpack.packb("first"))])
        assert proxy.receive() == protocol.chunks([]), "a sign of life, no chunk"
        release.set()
        while (message := proxy.receive()) == protocol.chunks([]):
            pass
        assert message == protocol.results([protocol.end(job_id)])


def test_a_generator_that_sends_sends_no_heartbeat():
    with FakeProxy(Spell()) as proxy:
        proxy.send(protocol.batch([protocol.job(b"\1" * 16, 5000, msgpack.packb("abc"))]))
        messages = [proxy.receive() for _ in range(4)]
    assert protocol.chunks([]) not in messages


def test_a_generator_holding_no_job_sends_no_sign_of_life(monkeypatch):
    # Its worker is idle to the proxy once every job ended: a frame then broke the protocol.
    monkeypatch.setattr(_streaming, "HEARTBEAT", 0.0)

    class Lingers(corral.Worker):
        def forward(self, batch):
            yield ["a"] * len(batch)
            yield [corral.END] * len(batch)
            for _ in range(3):
                yield [None] * len(batch)  # steps on after every job has ended

    first, second = b"\1" * 16, b"\2" * 16
    with FakeProxy(Lingers()) as proxy:
        proxy.send(protocol.batch([protocol.job(first, 5000, msgpack.packb("x"))]))
        assert proxy.receive() == protocol.chunks([protocol.chunk(first, msgpack.packb("a"))])
        while (message := proxy.receive()) == protocol.chunks([]):
            pass  # signs of life while the job was held
        assert message == protocol.results([protocol.end(first)])
        proxy.send(protocol.batch([protocol.job(second, 5000, msgpack.packb("x"))]))
        # Nothing between the end and the next batch's first chunk.
        assert proxy.receive() == protocol.chunks([protocol.chunk(second, msgpack.packb("a"))])


def test_warm_up_of_a_streaming_forward_that_consumes_its_list_counts_positions():
    """Serving counts the positions it gave; warm-up counted the list forward had emptied, and
    a worker that serves fine failed every start (a crash loop) once it had examples."""

    class Consuming(corral.Worker):
        examples = ("hi", "yo")

        def forward(self, words):
            taken = []
            while words:
                taken.append(words.pop(0))
            yield [w.upper() for w in taken]
            # After END, what a position yields is dropped: not postprocessed here either.
            yield [corral.END] * len(taken)
            yield [object()] * len(taken)

    Consuming().warm_up()
    with FakeProxy(Consuming()) as proxy:
        assert proxy.stream(["ab"]) == [Stream(["AB"], "end")]


def test_remaining_in_a_streaming_forward_is_the_latest_live_items():
    seen = []

    class Timed(corral.Worker):
        def forward(self, words):
            seen.append(self.remaining())
            yield [corral.END] + [None] * (len(words) - 1)
            seen.append(self.remaining())
            yield [w for w in words]

    with FakeProxy(Timed()) as proxy:
        proxy.stream(["a", "b"], timeout_ms=30_000)
    # It had stayed infinite (and as JSON, an unrepresentable 500).
    assert 20 < seen[0] <= 30 and 20 < seen[1] <= 30, seen


def test_remaining_is_infinite_once_an_item_streams():
    # Its end is then the proxy's stream timeout: a finite value past its first-chunk deadline
    # told a worker to give up on a healthy stream.
    seen = []

    class Streams(corral.Worker):
        def forward(self, words):
            yield ["a"] + [None] * (len(words) - 1)
            seen.append(self.remaining())
            yield [corral.END] * len(words)

    with FakeProxy(Streams()) as proxy:
        proxy.stream(["x", "y"], timeout_ms=30_000)
    assert seen == [float("inf")]


def test_a_streaming_warm_up_runs_at_most_max_running_examples_at_once():
    sizes = []

    class Bounded(corral.Worker):
        examples = ("a", "b", "c")
        max_running = 2

        def forward(self, words):
            sizes.append(len(words))
            yield [corral.END] * len(words)

    Bounded().warm_up()
    assert sizes == [2, 1]


def test_the_fake_proxy_bounds_its_batches_by_max_running_as_the_proxy_does():
    class Two(Spell):
        max_running = 2

    with FakeProxy(Two()) as proxy:
        streams = proxy.stream(["ab", "cd", "ef", "gh", "ij"])
        batches = [event[1] for event in proxy.events if event[0] == "batch"]
    assert [s.chunks for s in streams] == [list(w) for w in ["ab", "cd", "ef", "gh", "ij"]]
    assert batches[0] == [0, 1], batches
    assert all(len(batch) <= 2 for batch in batches), batches


@pytest.mark.timeout(10)
def test_a_generator_whose_streams_were_all_cancelled_is_closed_and_the_next_batch_served():
    # A live feed runs until its client leaves. Once every item was cancelled it had been
    # stepped on for good: the next batch waited behind it until the proxy declared it hung.
    class Feed(corral.Worker):
        def __init__(self):
            self.closed = 0

        def forward(self, items):
            try:
                while True:
                    yield list(items)
            finally:
                self.closed += 1

    worker = Feed()
    with FakeProxy(worker) as proxy:
        a, b = proxy.stream(["a", "b"], cancel_after={0: 2, 1: 3})
        assert (a.chunks, b.chunks) == (["a", "a"], ["b", "b", "b"])
        (c,) = proxy.stream(["c"], cancel_after={0: 1})
        assert c.chunks == ["c"]
    assert worker.closed == 2


@pytest.mark.timeout(10)
def test_a_generator_that_yields_on_after_ending_every_item_is_closed_at_that_yield():
    # Its code after the last END runs, up to a yield that can reach nobody. Stepped on, a
    # generator yielding for ever after its ENDs kept the next batch waiting for its 408, and
    # the worker, silent for a stream it no longer had, was killed as hung.
    class Lingering(corral.Worker):
        def __init__(self):
            self.after_end = []

        def forward(self, items):
            yield list(items)
            yield [corral.END] * len(items)
            self.after_end.append("ran")  # code after the last END still runs
            try:
                while True:
                    yield [None] * len(items)
            finally:
                self.after_end.append("closed")

    worker = Lingering()
    with FakeProxy(worker) as proxy:
        (a,) = proxy.stream(["a"])
        assert (a.chunks, a.status) == (["a"], "end")
        (b,) = proxy.stream(["b"])  # the next batch is served: the generator was closed
        assert b.chunks == ["b"]
    assert worker.after_end == ["ran", "closed"] * 2


@pytest.mark.timeout(10)
def test_a_joining_generator_holding_no_job_is_left_running_for_the_next_to_join():
    # A joining worker's generator may be its engine's loop: a batch sent to it while it holds
    # nothing joins it.
    class Engine(corral.Worker):
        max_running = 4

        def __init__(self):
            self.runs = 0

        def forward(self, items):
            self.runs += 1
            items = list(items)
            while len(items) < 2 or len(self.cancelled) < len(items):
                items += yield [None if p in self.cancelled else x for p, x in enumerate(items)]

    worker = Engine()
    with FakeProxy(worker) as proxy:
        a, b = proxy.stream(["a"], cancel_after={0: 1, 1: 1}, join=["b"])
    assert (a.chunks, b.chunks) == (["a"], ["b"])
    assert worker.runs == 1  # b joined the generator a had left


def test_a_generator_whose_last_item_ended_with_end_runs_on_to_its_return():
    # Only a generator whose last items were cancelled is closed: one that ended them with END
    # runs its code after the last yield, whatever an earlier item's cancel.
    class Tail(corral.Worker):
        def __init__(self):
            self.after = False

        def forward(self, items):
            yield list(items)
            while 0 not in self.cancelled:
                yield [None, "b"]
            yield [None, corral.END]
            self.after = True

    worker = Tail()
    with FakeProxy(worker) as proxy:
        a, b = proxy.stream(["a", "b"], cancel_after={0: 1})
    assert a.chunks == ["a"] and b.chunks[-1] == "b"
    assert worker.after


@pytest.mark.timeout(WAIT)
def test_a_joining_worker_half_closed_mid_stream_ends_cleanly():
    """The end of the connection seen between steps was taken for forward's failure (its job
    ended with `_Closed: `) and the serve thread then waited for ever."""
    with FakeProxy(Joining()) as proxy:
        proxy.send(protocol.batch([protocol.job(b"j" * 16, 5000, msgpack.packb("long"))]))
        first = proxy.receive()
        assert first["type"] in ("chunks", "pull"), first
        proxy.half_close()
        seen = []
        while (message := proxy.receive()) is not None:
            seen.append(message)
        assert not [
            result
            for message in seen
            if message["type"] == "results"
            for result in message["results"]
            if result["status"] == "error"
        ], seen
        assert proxy.worker_error is None
    assert not proxy._thread.is_alive()


class Letters(corral.Worker):
    """Streams each word a letter a step; items join between steps."""

    max_running = 2

    def forward(self, words):
        words, sent = list(words), []
        while True:
            sent += [0] * (len(words) - len(sent))
            step = [w[n] if n < len(w) else corral.END for w, n in zip(words, sent)]
            sent = [n + 1 for n in sent]
            words += (yield step) or []


@pytest.mark.timeout(WAIT)
def test_stream_with_only_join_items_sends_them_as_one_batch_and_no_empty_one():
    with FakeProxy(Letters()) as proxy:
        streams = proxy.stream([], join=["ab"])
        assert [s.status for s in streams] == ["end"]
        assert [event for event in proxy.events if event[0] == "batch"] == [("batch", [0])]
        with pytest.raises(ValueError, match="no items"):
            proxy.stream([])


def test_fake_proxy_refuses_a_cancel_for_no_item_and_a_negative_timeout():
    # A cancel_after index past the items was never sent, silently; timeout_ms=-5 stopped the
    # worker with a ProtocolError.
    with FakeProxy(Spell()) as proxy:
        with pytest.raises(ValueError, match=r"cancel_after names item 5; there are 3"):
            proxy.stream(["ab", "c"], join=["d"], cancel_after={5: 1})
        # Nor was one for an item named by no whole number, or after a count of chunks no
        # chunk reaches ("0": a bare TypeError).
        for named in ({0.5: 1}, {"0": 1}, {True: 1}):
            with pytest.raises(ValueError, match=r"cancel_after names item"):
                proxy.stream(["ab", "c"], cancel_after=named)
        for count in ({0: -1}, {0: "1"}, {0: 1.5}):
            with pytest.raises(ValueError, match=r"cancel_after\[0\] must be a whole number"):
                proxy.stream(["ab", "c"], cancel_after=count)
        with pytest.raises(ValueError, match=r"timeout_ms must be .* 0 or more: -5"):
            proxy.stream(["ab"], timeout_ms=-5)
        with pytest.raises(ValueError, match="timeout_ms must be"):
            proxy.infer(["ab"], timeout_ms=1.5)
        with pytest.raises(ValueError, match="timeout_ms must be"):
            proxy.infer(["ab"], timeout_ms=2**70)
        assert proxy.stream(["ab"], cancel_after={0: 1}) == [Stream(["a"], "end")]
        numpy = pytest.importorskip("numpy")
        assert proxy.stream(["ab"], timeout_ms=numpy.int64(5000)) == [Stream(["a", "b"], "end")]
