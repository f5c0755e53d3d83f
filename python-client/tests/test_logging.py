"""The worker's own log: failures of the worker's code logged with their jobs, in full once a
minute per kind (``_failures``), and records as JSON lines when Corral's log is JSON
(``_logging``)."""

from __future__ import annotations

import json
import logging
import os
import re
import uuid

import pytest

from corral import _failures, _logging

A, B = uuid.UUID(int=1), uuid.UUID(int=2)


@pytest.fixture(autouse=True)
def fresh():
    _failures.forget()
    yield
    _failures.forget()


def raise_here(message: str) -> BaseException:
    try:
        raise RuntimeError(message)
    except RuntimeError as e:
        return e


def raise_there(message: str) -> BaseException:
    try:
        raise RuntimeError(message)
    except RuntimeError as e:
        return e


def test_a_failure_is_logged_with_its_jobs_then_counted_until_a_minute_passed(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(_failures.time, "monotonic", lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="corral"):
        _failures.failed("forward", raise_here("one"), [A.bytes, B.bytes])
        for _ in range(3):
            _failures.failed("forward", raise_here("again"), [A.bytes])
        assert [r.getMessage() for r in caplog.records] == [f"forward failed for jobs {A}, {B}"]
        assert caplog.records[0].exc_info[1].args == ("one",)
        now[0] += _failures.EVERY
        _failures.failed("forward", raise_here("later"), [B.bytes])
    assert caplog.records[-1].getMessage() == (
        f"forward failed for job {B} (3 more like it since it was last logged, 60 s ago)"
    )


def test_an_id_that_is_not_16_bytes_is_named_in_hex_not_a_second_failure(caplog):
    with caplog.at_level(logging.ERROR, logger="corral"):
        _failures.failed("forward", raise_here("x"), [b"short"])
    assert caplog.records[0].getMessage() == "forward failed for job 73686f7274"


def test_a_long_record_is_shortened_in_its_middle_to_stay_one_line_corral_reads_whole():
    record = logging.LogRecord("corral", logging.ERROR, __file__, 1, "m" * 30_000, None, None)
    error = raise_here("x" * 40_000)
    record.exc_info = (type(error), error, error.__traceback__)
    line = _logging.JsonLines().format(record)
    assert len(line.encode()) <= _logging.LINE
    entry = json.loads(line)
    assert entry["level"] == "ERROR"
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert "characters left out" in entry["exception"]
    assert entry["exception"].endswith("xxx")


def test_a_long_record_of_text_json_escapes_keeps_its_head_and_tail():
    # Measured in characters of text where `é` takes six in the line, the whole message went
    # ("HEAD" and "TAIL" too), and a traceback quoting CJK text kept not even "Traceback".
    message = "HEAD" + "é" * 6000 + "TAIL"
    record = logging.LogRecord("corral", logging.INFO, __file__, 1, message, None, None)
    error = raise_here("界" * 8400)
    record.exc_info = (type(error), error, error.__traceback__)
    line = _logging.JsonLines().format(record)
    assert len(line.encode()) <= _logging.LINE
    entry = json.loads(line)
    assert entry["message"].startswith("HEADé") and entry["message"].endswith("éTAIL")
    assert "characters left out" in entry["message"]
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].endswith("界界界")
    # Not cut further than the line needs: about the line's length is kept.
    assert len(line) > _logging.LINE - 1000
    # Control characters too (each six in the line).
    record = logging.LogRecord(
        "corral", logging.INFO, __file__, 1, "A" + "\x01" * 10_000 + "Z", None, None
    )
    entry = json.loads(_logging.JsonLines().format(record))
    assert entry["message"].startswith("A\x01") and entry["message"].endswith("\x01Z")


def test_a_record_many_lines_long_is_cut_at_once_and_counts_all_it_left_out():
    # A field past two lines' characters keeps a line's worth of each end before it is
    # measured (a 10 MB message had taken 13 s to cut, and its worker was killed as hung); the
    # count still says every character left out. A logger's name is kept short too.
    message = "H" + "x" * 1_000_000 + "é" * 1_000_000 + "T"
    record = logging.LogRecord("n" * 20_000, logging.INFO, __file__, 1, message, None, None)
    line = _logging.JsonLines().format(record)
    assert len(line.encode()) <= _logging.LINE
    entry = json.loads(line)
    head, left, tail = re.fullmatch(
        r"(.*) \[\.\.\. (\d+) characters left out \.\.\.\] (.*)", entry["message"], re.S
    ).groups()
    assert head.startswith("Hxx") and tail.endswith("ééT")
    assert len(head) + int(left) + len(tail) == len(message)
    assert len(entry["logger"]) <= 201


def test_failures_of_another_hook_or_line_are_logged_apart(caplog):
    with caplog.at_level(logging.ERROR, logger="corral"):
        _failures.failed("forward", raise_here("x"), [A.bytes])
        _failures.failed("forward", raise_there("x"), [A.bytes])
        _failures.failed("preprocess", raise_here("x"), [A.bytes])
        _failures.failed("forward", ValueError("never raised"), [A.bytes])
    assert len(caplog.records) == 4


def test_a_long_batch_names_its_first_jobs_and_counts_the_rest():
    ids = [uuid.UUID(int=n).bytes for n in range(10)]
    assert _failures.jobs(ids) == (
        "jobs " + ", ".join(str(uuid.UUID(int=n)) for n in range(4)) + " and 6 more"
    )


def test_json_lines_keep_a_record_s_level_and_traceback_together():
    record = logging.LogRecord("corral", logging.ERROR, __file__, 1, "failed %s", ("x",), None)
    error = raise_here("why")
    record.exc_info = (type(error), error, error.__traceback__)
    line = _logging.JsonLines().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == ("ERROR", "corral", "failed x")
    assert entry["exception"].startswith("Traceback (most recent call last):\n")
    assert entry["exception"].endswith("RuntimeError: why")


@pytest.mark.parametrize(
    ("number", "level"),
    [(45, "ERROR"), (55, "CRITICAL"), (35, "WARNING"), (25, "INFO"), (5, "DEBUG"), (1, "DEBUG")],
)
def test_a_level_of_the_application_s_own_is_written_as_the_standard_one_below_it(number, level):
    # Corral reads the five standard names only: a level-45 record had become a plain INFO
    # line, its ERROR alert never firing.
    record = logging.LogRecord("app", number, __file__, 1, "m", None, None)
    record.levelname = f"CUSTOM{number}"  # as addLevelName names it
    assert json.loads(_logging.JsonLines().format(record))["level"] == level


@pytest.mark.parametrize("form", ["json", "text", None])
def test_configure_leaves_an_application_s_logging_alone_and_follows_corral_s_format(
    monkeypatch, form
):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers = []
    try:
        if form is None:
            monkeypatch.delenv("CORRAL_LOG_FORMAT", raising=False)
        else:
            monkeypatch.setenv("CORRAL_LOG_FORMAT", form)
        _logging.configure()
        (handler,) = root.handlers
        expected = _logging.JsonLines if form == "json" else logging.Formatter
        assert type(handler.formatter) is expected
        if form != "json":  # as text, with a timestamp first
            record = logging.LogRecord("corral", logging.INFO, __file__, 1, "hello", None, None)
            assert re.match(
                r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} corral INFO hello$", handler.format(record)
            )
        assert root.level == logging.INFO
        _logging.configure()  # a handler is there now: nothing is added
        assert root.handlers == [handler]
    finally:
        root.handlers, level = saved
        root.setLevel(level)


def test_a_lone_surrogate_is_written_as_text_corral_can_read_as_json():
    # os.fsdecode turns an undecodable byte of a file name into a lone surrogate; json.dumps
    # wrote it as "\udcff", which serde_json refuses: the record became a plain INFO line.
    name = os.fsdecode(b"/data/img-\xff.png")
    record = logging.LogRecord(
        "corral", logging.ERROR, __file__, 1, "cannot open %s", (name,), None
    )
    line = _logging.JsonLines().format(record)
    assert "\\udcff" not in line.lower()
    entry = json.loads(line)
    assert entry["level"] == "ERROR"
    assert entry["message"].encode("utf-8") == b"cannot open /data/img-\\xff.png"
