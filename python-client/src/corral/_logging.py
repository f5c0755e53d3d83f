"""The worker's log, where the application has not set logging up itself: to stderr, at INFO,
with a timestamp; and as one JSON object per record when ``CORRAL_LOG_FORMAT`` is ``json``, which
Corral sets for the workers it spawns when its own log is JSON (``--log-format json``).

Corral forwards each line a worker writes into its own log. As plain text a record's level was
lost there (every forwarded line was INFO, alerts on errors never fired) and a traceback became a
line per frame; as one JSON object the record keeps its level, logger and traceback together,
and Corral merges it into its own line for the worker.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable

from corral._protocol import safe_text

TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure() -> None:
    """Sets up the root logger as above, unless the application already gave it a handler
    (``basicConfig`` then does nothing)."""
    handler = logging.StreamHandler()
    if os.environ.get("CORRAL_LOG_FORMAT") == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(logging.Formatter(TEXT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


# Longest line written as JSON: Corral forwards a worker's line in pieces of 16 KiB, and a record
# cut in two would no longer be one (its level and traceback lost to plain INFO text).
LINE = 16_000


def _standard_level(number: int) -> str:
    """The standard level at or below ``number`` (DEBUG below it too): Corral reads only those
    five names, and a record at a level of the application's own (``log.log(45, ...)``, a
    ``NOTICE`` made with ``addLevelName``) had become a plain INFO line, its traceback no longer
    merged in."""
    for at, name in ((50, "CRITICAL"), (40, "ERROR"), (30, "WARNING"), (20, "INFO")):
        if number >= at:
            return name
    return "DEBUG"


class JsonLines(logging.Formatter):
    """A record as one line of JSON: ``level``, ``logger``, ``message``, and ``exception`` (the
    traceback, newlines kept inside the string) when it has one. A line longer than
    :data:`LINE` has the middle of its message, traceback and stack left out, each its share,
    and says how much."""

    def format(self, record: logging.LogRecord) -> str:
        level = _standard_level(record.levelno)
        # A logger's name is a short word: one of 20,000 characters made the line too long.
        logger = record.name if len(record.name) <= 200 else record.name[:200] + "…"
        entry = {"level": level, "logger": logger, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # A field of more than two lines' characters keeps a line's worth of each end at once
        # (a character is at least one in the line), so that what follows measures and escapes
        # at most that much, whatever the record's size: a 10 MB message had taken 13 s here.
        omitted: dict[str, int] = {}
        for key in _CUT:
            text = entry.get(key, "")
            if len(text) > 2 * LINE:
                entry[key], omitted[key] = text[:LINE] + text[-LINE:], len(text) - 2 * LINE
        line = _dumps(entry)
        for _ in range(8):  # a few passes at most: one usually does
            long = [key for key in _CUT if len(entry.get(key, "")) > 256]
            if len(line) <= LINE or not long:
                break
            # Each field gives up its share of the excess, by its length in the line: a long
            # message does not take the whole traceback with it.
            sizes = {key: _encoded(entry[key]) for key in long}
            excess, total = len(line) - LINE, sum(sizes.values())
            for key in long:
                share = excess * sizes[key] // total + 1
                entry[key] = _shorten(entry[key], share, omitted.pop(key, 0))
            line = _dumps(entry)
        return line


# The fields a long record is cut in.
_CUT = ("message", "exception", "stack")


def _dumps(entry: dict[str, str]) -> str:
    # ASCII only: its length in characters is its length in bytes. A lone surrogate (an
    # undecodable byte of a file name, through ``os.fsdecode``) would be written as a ``\udcff``
    # escape, which is not JSON Corral can read: the record fell back to a plain INFO line, its
    # level lost. Such characters go as ``\xNN`` text instead (``safe_text``).
    return json.dumps({key: safe_text(str(value)) for key, value in entry.items()})


def _encoded(text: str) -> int:
    """The characters ``text`` takes in a line's JSON: ASCII only, so ``é`` takes six."""
    return len(_dumps({"": text})) - len(_dumps({"": ""}))


def _shorten(text: str, over: int, omitted: int = 0) -> str:
    """``text`` at least ``over`` characters of JSON shorter, its middle left out: a traceback's
    first and last frames say the most. Measured as written in the line: counted in characters
    of text, a message of ``é`` (six in JSON) lost all of itself, head and tail too. ``omitted``:
    characters already left out of its middle (said in the count)."""
    budget = max(0, _encoded(text) - over - 64)
    head = _fitting(budget // 2, lambda k: text[:k], len(text))
    tail = _fitting(budget - _encoded(text[:head]), lambda k: text[len(text) - k :], len(text))
    gap = f" [... {len(text) - head - tail + omitted} characters left out ...] "
    return text[:head] + gap + text[len(text) - tail :]


def _fitting(budget: int, part: Callable[[int], str], most: int) -> int:
    """The most characters ``part(k)`` takes within ``budget`` characters of JSON (each is at
    least one): a bisection, on a long record's way out alone."""
    low, high = 0, min(most, budget)
    while low < high:
        middle = (low + high + 1) // 2
        if _encoded(part(middle)) <= budget:
            low = middle
        else:
            high = middle - 1
    return low
