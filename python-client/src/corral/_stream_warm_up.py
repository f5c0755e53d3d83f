"""Warm-up of a streaming worker: its ``forward`` run on the examples to their end, each chunk
postprocessed, encoded and held to what the proxy reads, as serving would. What serving drops,
warm-up passes: a value at an ended position, and once every example has ended, the generator's
next step (closed at its next yield, as serving closes it, or as a joining one would wait for a
batch that never comes here; stepped on, a feed loop's warm-up never ended) and any failure of
it (an error, a wrong yield, a value returned: they fail nobody). Kept beside ``_streaming``,
which it reads (:data:`END` and the checks of a yield), and which never imports it.
"""

from __future__ import annotations

from typing import Any

from corral import _batch, _output, _typing
from corral._streaming import END, Streamer, _check, _close, _returned


def warm_up(worker: Streamer, inputs: list[Any], first: int = 0) -> None:
    """Run a streaming ``forward`` on ``inputs`` to its end (or, once every example has ended,
    to its next yield), each chunk postprocessed and encoded; raises as the first failure
    before the last example's end does. ``first``: the number of the first among the examples."""
    worker.cancelled = set()
    # Counted before forward, which may consume its list (as serving counts positions), and
    # what serving drops (a value at an ended position) is not postprocessed: warm-up had
    # failed a worker that serves.
    positions = len(inputs)
    _batch.warm_up_batch(worker, positions)
    codec = _typing.codec(type(worker))
    ended: set[int] = set()
    generator = worker.forward(inputs)
    try:
        out = next(generator)
        while len(ended) < positions:
            _check(out, positions)
            for position, value in enumerate(out):
                if value is None or position in ended:
                    continue
                if value is END:
                    ended.add(position)
                    continue
                chunk = codec.encode(worker.postprocess(value))
                _output.check(chunk, f"a chunk of example {first + position}")
            try:
                out = generator.send([])
            except StopIteration:
                raise
            except Exception:
                if len(ended) < positions:
                    raise
                break  # past the last example's end: it fails nobody
    except StopIteration as stop:
        returned = _returned(stop)
        if returned is not None and len(ended) < positions:
            raise returned from None
    finally:
        _close(generator)
