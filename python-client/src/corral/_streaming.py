"""Streaming workers: a ``forward`` that is a generator, run step by step for one batch and the
batches that join it.

Lives here: :data:`END`; which ``features`` a worker class declares in its hello; :func:`run`,
which drives one generator from the batch that starts it until it returns — each ``yield``
becomes one ``chunks`` frame (postprocessed, aligned with the positions), ``END`` and every
failure end their jobs at once in a ``results`` frame, and between two yields the cancelled ids
and the deadlines become ``worker.cancelled``, queued batches join (a joining worker), and a
``pull`` offers the room left under ``max_running`` (warm-up runs the examples in
``_stream_warm_up``). ``worker.deadlines`` and ``worker.content_types`` grow with the positions.

A generator holding no job is given one step (``[]`` joined) to return, once it has seen every
end: an item that ended without its ``END`` (cancelled) it learns of in ``worker.cancelled`` only
at the step after, and a yield in that step is not yet one too many. Yielding again instead,
it is closed at that yield; but a joining one within its positions waits there, blocked on the
connection, for the proxy's next batch (whose inputs that yield returns) or end (closed then):
stepped on, an engine's loop spun a core while no request came.

Positions: the items of the batch that starts the generator are positions ``0 .. n-1``; each
joined item gets the next position, in order; a position is never reused or moved during one
run, whether its item ended or not. Each yield is a list with one entry per position so far.

Each batch's jobs are prepared, and each chunk postprocessed and encoded into its entry, by the
per-job steps of ``_batch`` that a plain worker's batch goes through too. The connection (a
``_serve.Link``) and the worker (a :class:`Streamer`, which ``_worker.Worker`` is) are passed in:
this module imports ``_serve`` for that type alone, while type checking, and never ``_worker``
(which imports this module), so there is no import cycle.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Generator, Set
from typing import TYPE_CHECKING, Any, Protocol

from corral import _batch, _failures, _tracing
from corral import _protocol as protocol
from corral._errors import STOPS as _STOPS
from corral._errors import ConnectionEnded, ProtocolError, amount
from corral._errors import describe as _describe

if TYPE_CHECKING:
    from corral._serve import Link

log = logging.getLogger("corral")

# The clock deadlines are compared with (time.monotonic; a test may put a fake one here).
_now = time.monotonic

HEARTBEAT = 0.5
"""Seconds a stepping generator may go without a frame to the proxy before it sends an empty
``chunks`` frame, a sign of life: the proxy's hung clock for a streaming worker counts from its
last frame, and a generator whose steps yielded nothing (every item waiting on something) for
longer than a route's timeout plus a second was killed as hung, its streams ended
``worker_died``. Below that second, whatever the timeout."""


class _End:
    """The type of :data:`END`."""

    _instance: _End | None = None

    def __new__(cls) -> _End:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "corral.END"

    def __reduce__(self) -> str:
        return "END"


END = _End()
"""Yield this at an item's position to end its stream now: its ``end`` result goes out at
once, so its client's stream closes while its batch-mates go on."""


class Streamer(_batch.Hooks, Protocol):
    """What running a stream uses of a worker, beyond the batch step's hooks (``max_running``
    is read with ``getattr``: it may be unset)."""

    cancelled: Set[int]

    def forward(self, batch: list[Any]) -> Any: ...


def is_streaming(worker: Any) -> bool:
    """Whether a Worker's (class or instance) ``forward`` is a generator function: itself (a
    generator wrapper around a plain one streams), or under a decorator that keeps
    ``__wrapped__`` (``functools.wraps``) and returns its generator. Served as a plain worker, a
    generator's steps would be taken for the items' outputs. (A decorator that turns the
    generator into a list must not keep ``__wrapped__``.)"""
    forward = getattr(worker, "forward", None)
    if forward is None:
        return False
    return inspect.isgeneratorfunction(forward) or inspect.isgeneratorfunction(
        inspect.unwrap(forward)
    )


def features(worker: Any, limit: int) -> list[str]:
    """The hello's ``features``: ``stream`` and ``cancel`` for a generator ``forward``, and
    ``join`` when it also sets ``max_running`` (``limit``, read once: :func:`limit`); none of
    these for a plain worker (which could not act on a cancel in the middle of ``forward``: it
    declares ``shm`` instead, see ``_shared_memory``)."""
    if not is_streaming(worker):
        return []
    return ["stream", "cancel", "join"] if limit else ["stream", "cancel"]


def limit(worker: Any) -> int:
    """How many jobs a streaming worker runs at once (``max_running``; 0: no limit, no joining).
    Read once a connection, for its hello and for :func:`run` to keep to: a worker that sets it
    later (once its model is loaded, say) must not offer room it declared no ``join`` for."""
    limit = getattr(worker, "max_running", None)
    if limit is None:
        return 0
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise TypeError(f"max_running must be None or a non-negative integer, not {limit!r}")
    return min(limit, MAX_RUNNING)


def run(worker: Streamer, jobs: list[dict[str, Any]], link: Link, limit: int) -> None:
    """Answer a batch with a streaming ``forward``, sending every frame through ``link``: the
    jobs that fail before ``forward`` at once, then chunks step by step, and each job's result
    as soon as it ends. ``limit`` is the connection's (:func:`limit`): a worker that declared no
    ``join`` must never offer room. Returns once the generator has returned (or failed) and
    every job it was given has its result."""
    state = _Run(worker, link, limit)
    inputs = state.admit(jobs)
    state.flush()  # a job that failed preprocess is answered now, not after the stream
    if not inputs:
        return
    worker.cancelled = state.cancelled
    worker.deadlines = state.deadlines
    worker.content_types = state.content_types
    state.set_deadline()
    try:
        generator = worker.forward(inputs)
    except _STOPS as e:
        _failures.stopping("forward", e)
        raise
    except BaseException as e:
        # A wrapper (functools.wraps) around a generator may raise before it returns one: the
        # batch's jobs fail, and the worker lives on, as for a failure mid-stream.
        _failures.failed("forward (before streaming)", e, state.live_ids())
        state.finish(e)
        return
    failure: BaseException | None = None
    # The batch's `forward` span (if its jobs are traced) lasts as long as its stream, and is
    # current while the generator runs, so the user's spans inside it nest under it.
    with _tracing.batch(jobs):
        failure = _drive(generator, state)
    live = state.live_ids()
    if failure is not None and live:
        # (With every item ended already, a failure at the end fails nobody: not logged.)
        _failures.failed("forward (while streaming)", failure, live)
    state.finish(failure)


def _drive(generator: Generator[Any, Any, Any], state: _Run) -> BaseException | None:
    """Steps the generator to its end, sending its chunks and taking joins between steps;
    the exception ``forward`` raised, if it did."""
    failure: BaseException | None = None
    try:
        joined: list[Any] | None = None
        while True:
            try:
                out = next(generator) if joined is None else generator.send(joined)
                _check(out, len(state.ids))
            except StopIteration as stop:
                # The streams still open fail, saying why: a stray `yield` in a plain-looking
                # forward had answered every client 200 with no chunk, its outputs dropped.
                failure = _returned(stop)
                break
            except _STOPS as e:
                _failures.stopping("forward (while streaming)", e)
                raise
            except BaseException as e:
                failure = e
                break
            try:
                state.step(out)
                joined = state.between_steps()
                if state.abandoned():
                    break  # closed in `finally`
            except (*_STOPS, OSError, ProtocolError, ConnectionEnded):
                raise  # the worker's stop, or the connection's end
            except Exception as e:
                # A `forward` that changed what the run keeps (``self.deadlines.pop()``, say)
                # fails its batch, not the worker: it once ended the process.
                failure = e
                break
    finally:
        _close(generator)
    return failure


# The largest `max_running` taken as it is: the hello's `max_batch` is 32 bits (a larger one is
# as good as none).
MAX_RUNNING = 2**32 - 1

# The most positions one run of a joining generator takes; past them it offers no more room,
# its streams finish, and the next batch starts a new run from position 0. A run's lists, and
# the worker's own per-step loop over its positions, grow with every job that joined: under
# steady traffic a run never ends on its own (at 40,000 jobs a step cost 0.8 ms in the package
# alone). 16 x max_running where that is more.
MAX_POSITIONS = 4096


class _Run:
    """One generator's jobs, by position, and what has been sent for them."""

    def __init__(self, worker: Streamer, link: Link, limit: int) -> None:
        self.worker = worker
        self.link = link
        self.limit = limit
        self.ids: list[bytes] = []
        self.deadlines: list[float] = []  # worker.deadlines during the run
        self.content_types: list[str | None] = []  # worker.content_types during the run
        self.cancelled: set[int] = set()  # worker.cancelled during the run
        self.live: set[int] = set()  # positions not yet ended
        self.waiting: set[int] = set()  # live positions that have sent no chunk yet
        self.by_id: dict[bytes, int] = {}
        self.results: list[dict[str, Any]] = []  # to send at the next flush
        self.offer = 0  # the standing pull offer, 0 for none
        self.last_cancelled = False  # whether the job that ended last ended without an END
        # Whether a job ended without an END since the generator's last yield: it learns of that
        # (``worker.cancelled``) only when resumed, so its next yield is no step to return.
        self.cancelled_unseen = False
        # Whether the generator yielded with no job live (see `abandoned`).
        self.yielded_after_all_ended = False
        self.sent_at = time.monotonic()  # when a frame last went to the proxy

    @property
    def running(self) -> int:
        return len(self.live)

    def full(self) -> bool:
        """Whether a joining run has taken all the positions it may (:data:`MAX_POSITIONS`):
        it is offered no more room, and takes in no batch the proxy sends: that starts the
        next run."""
        return bool(self.limit) and len(self.ids) >= max(MAX_POSITIONS, 16 * self.limit)

    def abandoned(self) -> bool:
        """Whether nothing the generator computes can reach anyone: a worker that does not join
        holds no job of it any more, and the last to end ended without an ``END`` (a client
        left, a stream timed out, a chunk failed). It is then closed at its yield
        (``GeneratorExit``, its ``finally`` runs). Stepped on, a generator that runs until it is
        cancelled (a live feed) ran for good: the next batch waited behind it until the proxy
        declared the worker hung. One whose last item ended with ``END`` runs on to its return,
        as it always has (its code after the last yield runs; the proxy may send the next batch
        meanwhile, and a tail past that batch's route timeout and a second is taken as hung, as
        README says), unless it yields again: that
        yield has nobody to reach, and the generator is closed there alike (one that went on
        yielding had the next batch's client wait for its 408, and the worker, which sent no
        sign of life for a stream it no longer had, killed as hung).

        A joining run past its positions (:meth:`full`) that holds no job is given one more step
        to return (once it has seen every end: :meth:`_note_yield`), then closed alike: a
        generator written as a loop that never returns (a feed that takes whatever joins) had
        taken in every batch the proxy sent it once idle, and its positions grew without end
        (8,000 after 8,000 requests). One within them waits for the
        next batch instead (:meth:`idle`)."""
        if self.live:
            return False
        if not self.limit:
            return self.last_cancelled or self.yielded_after_all_ended
        return self.full() and self.yielded_after_all_ended

    def live_ids(self) -> list[bytes]:
        """The ids of the jobs not yet ended, in order."""
        return [self.ids[position] for position in sorted(self.live)]

    def admit(self, jobs: list[dict[str, Any]]) -> list[Any]:
        """Prepare a batch's jobs: those that fail (422, 500, expired) are answered at the next
        flush; the others take the next positions. Returns their inputs, in order."""
        answers, inputs, deadlines = _batch.prepare(self.worker, jobs)
        for job, answer, deadline in zip(jobs, answers, deadlines):
            if answer is not None:
                self.results.append(answer)
                continue
            position = len(self.ids)
            self.ids.append(job["id"])
            self.deadlines.append(deadline)
            self.content_types.append(job.get("content_type"))  # checked by prepare
            self.by_id[job["id"]] = position
            self.live.add(position)
            self.waiting.add(position)
            self.yielded_after_all_ended = False  # holding a job again: a new idle spell later
        return inputs

    def step(self, out: list[Any]) -> None:
        """Send one yield: its chunks in one frame, its ENDs and failures in a results frame."""
        self._note_yield()
        entries: list[dict[str, Any]] = []
        owners: list[int] = []
        answer = _batch.answerer(self.worker, chunks=True)  # one Packer for the step's chunks
        # Live positions only (an ended one's value is dropped): not every position the run
        # ever had, which grew the cost of each step with every job that had joined.
        for position in sorted(self.live):
            value = out[position]
            if value is None:
                continue
            job_id = self.ids[position]
            if value is END:
                self._end(position, protocol.end(job_id))
                continue
            entry = answer(job_id, self.deadlines[position], self.content_types[position], value)
            if "status" in entry:  # the chunk failed: its job's error result
                self._fail(position, entry)
                continue
            entries.append(entry)
            owners.append(position)
            self.waiting.discard(position)
        _batch.clear(self.worker)
        self.set_deadline()
        if entries:
            frames, too_large = protocol.encode_chunks(entries)
            for index in too_large:
                position = owners[index]
                message = "a chunk is too large for one frame"
                self._fail(position, protocol.error(self.ids[position], message))
            for frame in frames:
                self._send(frame)
        self.flush()
        if self.live and time.monotonic() - self.sent_at >= HEARTBEAT:
            self._send(protocol.encode_frame(protocol.chunks([])))

    def _note_yield(self) -> None:
        """Mark a yield made holding no job, in a step that brought no new end, as one past the
        step to return (:meth:`idle`, :meth:`abandoned`).

        A step that brought a cancel does not count: the generator learns of one only when
        resumed (``worker.cancelled``: its client left, its deadline or stream timeout passed,
        its chunk failed), and README's ``Spell`` yields once on seeing it, then returns. Counted
        there, a joining generator was left waiting, its ``finally`` (an engine session, GPU
        memory) run only at the next request, which joined it, or at shutdown."""
        seen_news = self.cancelled_unseen
        self.cancelled_unseen = False  # what ends from here on, it learns of at its next step
        if not self.live and not seen_news:
            self.yielded_after_all_ended = True

    def idle(self) -> bool:
        """Whether a joining run within its positions holds no job and its generator, given a
        step to return once it had seen every end (:meth:`_note_yield`), yielded again (a feed,
        an engine's loop): the worker is idle, in the proxy's eyes too, and nothing the
        generator computes reaches anyone until a batch comes. :meth:`between_steps` then
        blocks for it rather than step the generator on."""
        idle = bool(self.limit) and not self.live and self.yielded_after_all_ended
        return idle and not self.full()

    def between_steps(self) -> list[Any]:
        """Take in what the proxy sent meanwhile, cancel what is over, offer room; returns the
        inputs of the jobs that join (empty for a worker that does not join). An :meth:`idle`
        run first waits for the proxy's next batch (its inputs are what the generator's yield
        returns), or for the end of the connection or a ``shutdown``, raised as between
        batches (the generator is then closed at its yield)."""
        # Blocked on the connection, not stepping: a generator that never returns had spun a
        # core for as long as no request came (it is resumed with the batch that comes).
        arrived = self.link.wait_batches() if self.idle() else []
        # Cancels first: a cancel was read after the batch of the job it names, so that batch
        # is queued by now and is taken in below.
        cancelled = self.link.take_cancelled()
        joined: list[Any] = []
        # Past its positions, a run takes no batch in: one sent to it once it held no job is the
        # next run's (read by the serve loop once this generator is closed).
        if self.limit and not self.full():
            for jobs in arrived + self.link.take_batches():
                self.offer = 0  # the batch answering an offer uses it up
                joined.extend(self.admit(jobs))
        for job_id in cancelled:
            position = self.by_id.get(job_id)
            if position is not None and position in self.live:
                self._cancel(position, protocol.end(job_id))
        # A cancel for a job of a batch still queued (sent to this worker, idle in the proxy's
        # eyes once it ended every job, while this generator has not returned yet) is for the
        # run that batch starts: the proxy tells a worker only once.
        self.link.keep_cancelled(job_id for job_id in cancelled if job_id not in self.by_id)
        # The job's deadline bounds the time to its first chunk; once it streams, the proxy
        # says when it is over (its stream timeout) with a cancel.
        now = _now()
        for position in [p for p in self.waiting if self.deadlines[p] <= now]:
            message = "the deadline passed before the first chunk"
            self._cancel(position, protocol.expired(self.ids[position], message))
        self.flush()
        if not self.live:
            self.offer = 0  # holding no job, the worker is idle: an offer lapses with that
        elif self.limit and not self.offer and self.running < self.limit and not self.full():
            # One offer at a time: a new one only once the last was answered, so that the
            # proxy can never send more than the room there was. None while holding no job:
            # the proxy then sends a batch anyway, as to any idle worker.
            self.offer = self.limit - self.running
            self._send(protocol.encode_frame(protocol.pull(self.offer)))
        self.set_deadline()
        return joined

    def set_deadline(self) -> None:
        """``worker.deadline`` while the generator runs: while every live item still waits for
        its first chunk, the latest of their deadlines (each bounds its item's first chunk), so
        that once ``remaining()`` is not positive none can make it, as in a plain ``forward``.
        Once any item streams, its end is the proxy's stream timeout, not a deadline here:
        ``inf`` (a finite one would have told a worker to give up on healthy streams)."""
        streaming = len(self.waiting) < len(self.live)
        waiting = [self.deadlines[position] for position in self.waiting]
        self.worker.deadline = max(waiting) if waiting and not streaming else math.inf

    def finish(self, failure: BaseException | None) -> None:
        """After the generator: withdraw a standing offer (while still holding jobs: one that
        holds none is idle, and its offer lapsed), then end every job still live (``end``, or
        ``error`` if the generator failed)."""
        if self.offer and self.live:
            self._send(protocol.encode_frame(protocol.pull(0)))
            self.offer = 0
        for position in sorted(self.live):
            job_id = self.ids[position]
            if failure is None:
                self._end(position, protocol.end(job_id))
            else:
                self._end(position, protocol.error(job_id, _describe(failure)))
        self.flush()

    def flush(self) -> None:
        if self.results:
            self.link.send_results(self.results)
            self.sent_at = time.monotonic()
            self.results = []

    def _send(self, frame: bytes) -> None:
        self.link.send(frame)
        self.sent_at = time.monotonic()

    def _end(self, position: int, result: dict[str, Any]) -> None:
        self.live.discard(position)
        self.waiting.discard(position)
        self.results.append(result)
        self.last_cancelled = False

    def _fail(self, position: int, result: dict[str, Any]) -> None:
        """End a job with an error of its own; the worker sees it as cancelled."""
        self._end(position, result)
        self.cancelled.add(position)
        self.last_cancelled = True
        self.cancelled_unseen = True

    _cancel = _fail


def _returned(stop: StopIteration) -> TypeError | None:
    """A generator ``forward`` that returned a value (not None) at its end: nobody gets it."""
    if stop.value is None:
        return None
    return TypeError(
        f"forward is a generator (it has a `yield`), and it returned a value, "
        f"{type(stop.value).__name__} {stop.value!r:.60}, which no client gets: a streaming "
        "forward yields its outputs, one list a step; a plain one returns them and has no yield"
    )


def _check(out: Any, positions: int) -> None:
    if not isinstance(out, (list, tuple)):
        raise TypeError(f"forward must yield a list with one entry per item, not {out!r:.80}")
    if len(out) != positions:
        yielded = amount(len(out), "entry", "entries")
        raise RuntimeError(f"forward yielded {yielded} for {amount(positions, 'item', 'items')}")


def _close(generator: Generator[Any, Any, Any]) -> None:
    try:
        generator.close()
    except _STOPS as e:
        _failures.stopping("closing forward's generator", e)
        raise
    except BaseException:
        log.exception("closing the forward generator failed")
