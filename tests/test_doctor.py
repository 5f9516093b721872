"""``recserve doctor``: what this host offers, each fallback with its reason."""

from __future__ import annotations

import json
from pathlib import Path

from recserve.cli import main
from recserve.embedding import row_index


def test_doctor_reports_every_check_and_the_cache_index_a_node_would_use(tmp_path, capsys, monkeypatch):
    assert main(["doctor", "--dir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cpu"]["cores_usable"] >= 1 and report["torch"]["threads"] >= 1
    tier = report["ssd_tier"]
    assert tier["directory"] == str(tmp_path) and tier["mode"] and tier["engine"] in ("io_uring", "threads")
    assert tier["cache_index"] == ("native" if row_index.available()[0] else "dict")
    serving = report["serving"]
    assert serving["event_loop"] in ("uvloop", "asyncio") and set(serving["json_readers"]) <= {"native", "simdjson"}
    monkeypatch.setenv(row_index.INDEX_ENV, "dict")
    row_index.available.cache_clear()
    try:
        assert main(["doctor", "--dir", str(tmp_path)]) == 0
    finally:
        monkeypatch.delenv(row_index.INDEX_ENV)
        row_index.available.cache_clear()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("tier cache"))
    assert "dict key index, 123 B beside each cached row" in line and "$RECSERVE_ROW_INDEX=dict" in line


def test_doctor_refuses_a_directory_that_is_not_one(tmp_path, capsys):
    assert main(["doctor", "--dir", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_doctor_names_a_directory_it_cannot_write_in_not_its_test_file(capsys):
    assert main(["doctor", "--dir", "/proc"]) == 2
    err = capsys.readouterr().err
    assert "--dir /proc: no test file can be written there" in err and ".recserve-doctor-" not in err


def test_doctor_names_the_json_readers_left_and_why(tmp_path, capsys, monkeypatch):
    from recserve.serving.wire import json_numbers

    monkeypatch.setenv(json_numbers.READERS_ENV, "")
    json_numbers.probe.cache_clear()
    try:
        assert main(["doctor", "--dir", str(tmp_path)]) == 0
    finally:
        monkeypatch.delenv(json_numbers.READERS_ENV)
        json_numbers.probe.cache_clear()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("json"))
    assert line.startswith("json        tensors read by lists (") and "$RECSERVE_JSON_READERS" in line


def test_a_memory_file_system_is_named_as_one_where_tier_files_would_go(tmp_path, monkeypatch):
    """O_DIRECT opens on tmpfs, but the files are DRAM: tiering there saves no memory."""
    from recserve.commands import doctor

    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/root / ext4 rw 0 0\ntmpfs {tmp_path} tmpfs rw 0 0\n")
    real = Path

    monkeypatch.setattr(doctor, "Path", lambda p: mounts if p == "/proc/self/mounts" else real(p))
    assert doctor.filesystem_type(tmp_path / "sub") == "tmpfs" and doctor.filesystem_type(real("/")) == "ext4"
    _, why = doctor._direct_io(tmp_path)
    assert why.startswith("a memory file system (tmpfs): the table files would be in DRAM")
