"""A node's log lines (``recserve.logs``): one line per event whatever text a client or an operator chose, and a
bounded number of lines however often an event repeats."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import pytest

from recserve import logs
from recserve.serving.worker import main as worker_main

FORGED = "evil\n2026-12-02 00:00:00,000 recserve.serving ERROR forged\r\x1b[2J"


def record(msg: str, *args: object, line: int = 10, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("recserve.serving", logging.WARNING, "/x/model_loader.py", line, msg, args, exc_info)


def test_a_message_with_line_breaks_and_control_characters_stays_one_line():
    text = logs.OneLineFormatter("%(levelname)s %(message)s").format(record("model %s not loaded", FORGED))
    assert "\n" not in text and "\r" not in text and "\x1b" not in text
    assert text == r"WARNING model evil\n2026-12-02 00:00:00,000 recserve.serving ERROR forged\r\x1b[2J not loaded"


def test_a_traceback_keeps_its_lines():
    try:
        raise ValueError("bug")
    except ValueError:
        import sys

        text = logs.OneLineFormatter("%(message)s").format(record("unexpected error", exc_info=sys.exc_info()))
    assert text.startswith("unexpected error\nTraceback") and text.endswith("ValueError: bug")


def test_a_repeated_line_is_let_through_in_a_burst_then_once_a_second_saying_how_many_were_dropped():
    now = [0.0]
    limit = logs.RepeatLimit(burst=5, per_s=1.0, clock=lambda: now[0])
    passed = [limit.filter(record("model %s not loaded", i)) for i in range(100)]
    assert passed == [True] * 5 + [False] * 95
    assert limit.filter(record("another call site", line=11))  # each site has its own budget
    now[0] = 1.0
    late = record("model %s not loaded", "x")
    assert limit.filter(late) and late.getMessage() == "model x not loaded [95 more lines from here dropped before " \
                                                        "this one]"
    assert not limit.filter(record("model %s not loaded", "y"))
    now[0] = 100.0  # refilled up to the burst, no more
    assert [limit.filter(record("model %s not loaded", i)) for i in range(6)] == [True] * 5 + [False]


@pytest.mark.parametrize("name", ["rate 100%", 'a"b\\c\nd'])
def test_a_workers_lines_name_it_whatever_its_served_name(name, monkeypatch):
    """A served name is any text: in the worker's line format a ``%`` made every line a logging error, a newline
    split it."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    args = SimpleNamespace(model_config=SimpleNamespace(name=name), version="1", stage="model", worker_id=0)
    worker_main.log_to_stderr(args)  # type: ignore[arg-type]
    try:
        logging.getLogger("recserve.serving").warning("query failed")
    finally:
        for handler in root.handlers:
            handler.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"[{name.translate(logs.CONTROL)} v1 model worker 0] query failed")
