"""A streaming generator once it holds no job: given one step to return, then closed (a worker
that does not join, and warm-up, which has no next batch), or, joining, left waiting for the
next batch without being stepped. Steps are counted, never CPU time: a generator stepped on
while idle takes many steps where it should take one."""

import os

import msgpack
import pytest

import corral
from corral import _protocol as protocol
from corral import _streaming
from corral._errors import ConnectionEnded
from corral.testing import FakeProxy, Stream

# Steps a generator may take holding no job before it stops itself, failing: stepped on for
# good, it would otherwise hang the test instead of failing it.
RUNAWAY = 50


class EndsThenYieldsOn(corral.Worker):
    """Not joining: three chunks, END, and (a bug in a model loop) it keeps yielding."""

    examples = ("warm",)

    def __init__(self):
        self.after_end = 0  # yields made after every item had ended
        self.closed = 0

    def forward(self, items):
        try:
            for step in range(3 + RUNAWAY):
                if step > 3:
                    self.after_end += 1
                    assert self.after_end < RUNAWAY, "stepped on after every item ended"
                yield [str(step) if step < 3 else corral.END for _ in items]
        finally:
            self.closed += 1


class Engine(corral.Worker):
    """Joining, written as a loop that never returns (an engine's loop): each item gets one
    chunk, then END. ``resumed`` is what each yield returned, ``most_idle`` the most yields it
    made in a row holding no job; it stops itself, failing, past :data:`RUNAWAY` of them."""

    max_running = 4
    examples = ("warm",)

    def __init__(self):
        self.resumed: list[list] = []
        self.most_idle = 0
        self.closed = 0

    def forward(self, items):
        items, sent, ended = list(items), set(), set()
        idle = 0
        try:
            while True:
                idle = idle + 1 if len(ended) == len(items) else 0  # a yield holding no job
                self.most_idle = max(self.most_idle, idle)
                assert idle < RUNAWAY, "stepped on while holding no job"
                out = [None] * len(items)
                for p, item in enumerate(items):
                    if p not in sent:
                        out[p], sent = f"{item}!", sent | {p}
                    elif p not in ended:
                        out[p], ended = corral.END, ended | {p}
                new = yield out
                self.resumed.append(list(new))
                items += new
        finally:
            self.closed += 1


def test_warm_up_closes_a_generator_that_yields_on_after_its_examples_ended():
    # Served, it is closed at the yield after its last END (README); its warm-up stepped it on
    # for ever, and the worker never connected.
    worker = EndsThenYieldsOn()
    worker.warm_up()
    assert (worker.after_end, worker.closed) == (1, 1)
    with FakeProxy(EndsThenYieldsOn()) as proxy:  # the warm-up on entering, as Worker.run
        assert proxy.stream(["a"]) == [Stream(["0", "1", "2"], "end")]


def test_warm_up_of_a_joining_loop_that_never_returns_ends_once_its_examples_ended():
    worker = Engine()
    worker.warm_up()
    # One step to return ([] joined), then closed at its next yield: no batch comes in warm-up.
    assert (worker.resumed, worker.closed) == ([[], []], 1)
    with FakeProxy(Engine()) as proxy:
        assert proxy.stream(["a"]) == [Stream(["a!"], "end")]


class EndsThenStumbles(corral.Worker):
    """Ends its item, then fails where nobody is left to fail: its closing yield of the wrong
    length (joining), or a value returned (not)."""

    examples = ("warm",)

    def __init__(self, stumble: str):
        self.stumble = stumble
        self.max_running = 4 if stumble == "short yield" else 1

    def forward(self, items):
        yield [corral.END for _ in items]
        if self.stumble == "short yield":
            yield []  # one entry short: a failure at the end fails nobody
        if self.stumble == "raises":
            raise RuntimeError("cleanup failed")
        return "done"


@pytest.mark.parametrize("stumble", ["short yield", "raises", "returns"])
def test_warm_up_passes_a_worker_whose_failure_past_its_last_end_serving_drops(stumble):
    # Served, nothing fails (the stream had ended); warm-up had raised, and the worker never
    # started.
    worker = EndsThenStumbles(stumble)
    worker.warm_up()
    with FakeProxy(EndsThenStumbles(stumble)) as proxy:
        assert proxy.stream(["a"]) == [Stream([], "end")]


class IdleLink:
    """The proxy's side of a joining run that goes idle: nothing arrives while the run polls
    (``take_batches``); each wait for the next batch (``wait_batches``) is answered with the
    next of ``batches``, and once they are spent with ``end`` (the connection's end, or a
    shutdown's ``SystemExit``)."""

    def __init__(self, batches, end):
        self.batches = list(batches)
        self.end = end
        self.waits = 0
        self.statuses = []  # of the results sent, in order

    def send(self, frame):
        pass  # chunks and pulls: none answered here

    def send_results(self, results):
        self.statuses += [result["status"] for result in results]

    def take_cancelled(self):
        return set()

    def keep_cancelled(self, ids):
        list(ids)

    def take_batches(self):
        return []

    def wait_batches(self):
        self.waits += 1
        if not self.batches:
            raise self.end
        return [self.batches.pop(0)]


def job(payload):
    return protocol.job(os.urandom(16), 60_000, msgpack.packb(payload))


@pytest.mark.parametrize("end", [ConnectionEnded(), SystemExit(0)])
def test_an_idle_joining_generator_waits_for_the_next_batch_instead_of_stepping(end):
    # Holding no job, a loop that never returns was resumed with [] in a tight loop: a whole
    # core while no request came. Given one step to return, it now waits, and the batch that
    # comes is what its yield returns; the proxy's end closes it at that yield.
    worker, link = Engine(), IdleLink([[job("b")]], end)
    with pytest.raises(type(end)):
        _streaming.run(worker, [job("a")], link, _streaming.limit(worker))
    # a: its chunk, END; one step to return; then b joins where it waited; one step; the end.
    assert worker.resumed == [[], [], ["b"], [], []]
    assert worker.most_idle == 1
    assert link.waits == 2
    assert link.statuses == ["end", "end"]
    assert worker.closed == 1


def test_an_idle_joining_generator_under_the_fake_proxy_takes_one_step_per_idle_spell():
    worker = Engine()
    with FakeProxy(worker, warm_up=False) as proxy:
        assert proxy.stream(["a"]) == [Stream(["a!"], "end")]
        assert proxy.stream(["b"]) == [Stream(["b!"], "end")]
    # The connection's end closed it where it waited (close() joined the worker's thread).
    assert worker.closed == 1
    # One yield holding no job, at most, per idle spell (b may even join before it: timing);
    # stepped on, it made yields by the thousand while nothing came.
    assert worker.most_idle <= 1, worker.resumed
    assert ["b"] in worker.resumed  # b joined the running generator


class Spell(corral.Worker):
    """README's ``Spell``, joining: a letter a step, then END; an item in ``self.cancelled`` is
    over for it, found in the step after its cancel, which still yields. A ``"."`` sends no
    chunk (the item still waits for its first), a ``"!"`` fails its postprocess. With
    ``never_returns`` (an engine's loop) it yields on once every item has ended."""

    max_running = 4
    examples = ("ab",)

    def __init__(self, never_returns=False):
        self.never_returns = never_returns
        self.idle_yields = 0  # yields made knowing every item had ended
        self.returned = 0
        self.closed = 0

    def postprocess(self, letter):
        if letter == "!":
            raise ValueError("no such letter")
        return letter

    def forward(self, words):
        words, sent = list(words), [0] * len(words)  # letters sent; len + 1: over
        try:
            while self.never_returns or any(n <= len(w) for n, w in zip(sent, words)):
                if all(n > len(w) for n, w in zip(sent, words)):
                    self.idle_yields += 1
                    assert self.idle_yields < RUNAWAY, "stepped on while holding no job"
                step = [None] * len(words)
                for p, w in enumerate(words):
                    if p in self.cancelled:  # client gone: already ended for us
                        sent[p] = len(w) + 1
                    elif sent[p] <= len(w):
                        letter = w[sent[p]] if sent[p] < len(w) else corral.END
                        step[p] = None if letter == "." else letter
                        sent[p] += 1
                words += yield step
            self.returned += 1
        finally:
            self.closed += 1


class CancellingLink(IdleLink):
    """An :class:`IdleLink` whose proxy cancels ``cancelled`` (a client that left, a stream
    timeout) at the run's first look for cancels, after its first step."""

    def __init__(self, cancelled, batches=(), end=None):
        super().__init__(batches, end or ConnectionEnded())
        self.cancels = [set(cancelled)]

    def take_cancelled(self):
        return self.cancels.pop() if self.cancels else set()


ENDINGS = {  # how the last item ends without its END: its word, and its result's status
    "cancel": ("abcdef", "end"),  # its client left, or its stream timed out
    "deadline": (".abc", "expired"),  # passed before its first chunk
    "postprocess": ("a!c", "error"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_joining_generator_whose_last_item_ended_without_end_returns(ending, monkeypatch):
    # It learns of that end in `self.cancelled` only at the step after, and yields there; that
    # yield was taken for an engine's loop that never returns, and the run waited at it for the
    # next request (which joined it) or shutdown: its `finally` (an engine session, GPU memory)
    # had run only then. Now it is resumed once more, and returns.
    word, status = ENDINGS[ending]
    a = job(word)
    link = CancellingLink([a["id"]] if ending == "cancel" else [])
    if ending == "deadline":
        monkeypatch.setattr(_streaming, "_now", lambda: float("inf"))
    worker = Spell()
    _streaming.run(worker, [a], link, _streaming.limit(worker))
    assert (worker.returned, worker.closed) == (1, 1)
    assert link.waits == 0
    assert link.statuses == [status]


def test_a_joining_loop_that_never_returns_waits_once_it_has_seen_its_last_cancel():
    # Its yield on seeing the cancel, then one more knowing every item ended (the step to
    # return it was given); then it waits, not stepped on, and the proxy's end closes it there.
    a = job("abcdef")
    worker, link = Spell(never_returns=True), CancellingLink([a["id"]])
    with pytest.raises(ConnectionEnded):
        _streaming.run(worker, [a], link, _streaming.limit(worker))
    assert (worker.idle_yields, worker.returned, worker.closed) == (1, 0, 1)
    assert link.waits == 1
    assert link.statuses == ["end"]
