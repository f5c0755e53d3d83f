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

TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure() -> None:
    """Sets up the root logger as above, unless the application already gave it a handler."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    if os.environ.get("CORRAL_LOG_FORMAT") == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(logging.Formatter(TEXT))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


class JsonLines(logging.Formatter):
    """A record as one line of JSON: ``level``, ``logger``, ``message``, and ``exception`` (the
    traceback, newlines kept inside the string) when it has one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)
