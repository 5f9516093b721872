"""Process helpers of ``recserve.hostinfo``: how a process ended, and the tail of its log."""

from __future__ import annotations

import signal

from recserve.hostinfo import how_it_ended, log_tail, signal_name


def test_log_tail_reads_the_last_non_empty_lines(tmp_path):
    log = tmp_path / "node.log"
    log.write_text("start\n\nloading\n  ready on :8000  \n\n\n")
    assert log_tail(log) == ["ready on :8000"]
    assert log_tail(log, lines=3) == ["start", "loading", "ready on :8000"]
    assert log_tail(tmp_path / "missing.log") == []
    (tmp_path / "empty.log").write_bytes(b"")
    assert log_tail(tmp_path / "empty.log") == []


def test_log_tail_reads_only_the_end_of_a_long_log(tmp_path):
    log = tmp_path / "node.log"
    log.write_bytes(b"x" * 100_000 + b"\n\xff bad byte\nlast\n")
    assert log_tail(log, lines=2, max_bytes=64) == ["\ufffd bad byte", "last"]
    assert all(len(line) <= 64 for line in log_tail(log, lines=5, max_bytes=64))


def test_signal_name_names_a_stopping_signal():
    assert signal_name(-signal.SIGKILL) == "SIGKILL"
    assert signal_name(0) is None
    assert signal_name(2) is None


def test_how_it_ended_is_one_wording_for_every_process_end():
    assert how_it_ended(-signal.SIGKILL) == "killed by SIGKILL (signal 9)"
    assert how_it_ended(-signal.SIGSEGV) == "killed by SIGSEGV (signal 11)"
    assert how_it_ended(-99) == "killed by signal 99"
    assert how_it_ended(1) == "exited with code 1"
    assert how_it_ended(None) == "exit status unknown"
