"""Writing SSD-tier table files: concurrent writers of one file, a full disk, a directory where a file should be."""

from __future__ import annotations

import builtins
import errno
import os
import threading
from types import SimpleNamespace

import pytest
import torch
import yaml

from recserve.cli import main
from recserve.embedding import tablefile
from recserve.embedding.tablefile import TableFileError, read_header, verify_table, write_table
from recserve.embedding.tiered import TieredTable, tier_model
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.zoo import build, sample_batch


def two_table_spec() -> ModelSpec:
    tables = (TableSpec("u0", 3000, 16, pooling=8, side="user"), TableSpec("i0", 500, 16, pooling=2, side="item"))
    return ModelSpec("sdm-files", "dlrm", 8, tables, "dot", SLA(50.0), bottom_mlp=(32, 16), top_mlp=(16, 1))


def leftovers(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not n.endswith(".tbl"))


def fsync_meeting(monkeypatch, parties: int = 2, timeout_s: float = 2.0) -> None:
    """Make every writer wait at its fsync until all have reached theirs (or ``timeout_s``): writers that do not
    take turns are then all mid-write at once, deterministically."""
    barrier, real = threading.Barrier(parties), os.fsync

    def fsync(fd: int) -> None:
        try:
            barrier.wait(timeout_s)
        except threading.BrokenBarrierError:
            pass
        real(fd)

    monkeypatch.setattr(tablefile.os, "fsync", fsync)


def test_two_writers_of_one_table_take_turns_and_the_second_keeps_the_first_file(disk_dir, monkeypatch):
    spec = two_table_spec()
    models = [build(spec, scale=1.0), build(spec, scale=1.0)]  # same seed: same weights, same file name
    ref = build(spec, scale=1.0)
    fsync_meeting(monkeypatch)
    results, errors = [None, None], []

    def start(k: int) -> None:
        try:
            results[k] = tier_model(models[k], [0], disk_dir, cache_bytes=1 << 16)
        except Exception as exc:  # noqa: BLE001 - the test reports what a writer raised
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert sorted(len(r.rebuilt) for r in results) == [0, 1], "one writer wrote, the other kept its file"
    assert leftovers(disk_dir) == [], "no temp or lock file is left"
    (name,) = os.listdir(disk_dir)
    verify_table(os.path.join(disk_dir, name))
    batch = sample_batch(ref, 8, rng=1)
    with torch.no_grad():
        for model in models:
            assert isinstance(model.tables[0], TieredTable)
            assert torch.equal(model(batch), ref(batch))


def test_concurrent_write_table_calls_never_expose_a_partial_file(disk_dir, monkeypatch):
    path = os.path.join(disk_dir, "t.tbl")
    weight = torch.randn(2000, 16)
    fsync_meeting(monkeypatch)
    errors: list[Exception] = []

    def write() -> None:
        try:
            write_table(path, weight)
        except Exception as exc:  # noqa: BLE001 - the test reports what a writer raised
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    verify_table(path, read_header(path))
    assert leftovers(disk_dir) == []


def test_temp_files_of_a_dead_writer_are_removed_by_the_next_write(disk_dir):
    path = os.path.join(disk_dir, "t.tbl")
    for stale in ("t.tbl.tmp", "t.tbl.k3j9x.tmp"):
        with open(os.path.join(disk_dir, stale), "wb") as f:
            f.write(b"x" * 100)
    write_table(path, torch.randn(100, 8))
    assert leftovers(disk_dir) == []


def disk_fills_after(monkeypatch, limit: int) -> None:
    """Table files written from now on fail with ENOSPC once ``limit`` bytes are written (a full file system)."""

    class Filling:
        def __init__(self, f) -> None:
            self.f, self.written = f, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.f.close()

        def write(self, data: bytes) -> int:
            if self.written + len(data) > limit:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.written += len(data)
            return self.f.write(data)

        def __getattr__(self, name: str):
            return getattr(self.f, name)

    monkeypatch.setattr(tablefile, "open", lambda *a, **k: Filling(builtins.open(*a, **k)), raising=False)


def test_disk_full_mid_write_is_one_line_and_leaves_no_temp_file(disk_dir, monkeypatch):
    disk_fills_after(monkeypatch, 32 * 1024)
    with pytest.raises(TableFileError, match=r"no space left writing t\.tbl: [\d,]+ bytes .* needed, .* free") as err:
        write_table(os.path.join(disk_dir, "t.tbl"), torch.randn(4000, 16))
    assert disk_dir in str(err.value) and "\n" not in str(err.value)
    assert os.listdir(disk_dir) == [], "the partial temp file (and the lock) are removed"


def test_too_little_free_space_is_refused_before_writing(disk_dir, monkeypatch):
    monkeypatch.setattr(tablefile.os, "statvfs", lambda _: SimpleNamespace(f_bavail=10, f_frsize=4096))
    with pytest.raises(TableFileError, match=r"not enough free space for 1 table file\(s\): [\d,]+ bytes "
                                             r"\([\d.]+ MiB\) needed, 40,960 bytes \(0\.0 MiB\) free"):
        tier_model(build(two_table_spec(), scale=1.0), [0], disk_dir, cache_bytes=0)
    assert os.listdir(disk_dir) == []


def tier_node_config(tmp_path, tier_dir: str) -> str:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"http_port": 0, "grpc_port": 0, "models": [{
        "model": "sdm-m1", "scale": 2e-5, "workers": 1, "max_batch_size": 64,
        "options": {"tier": {"dir": tier_dir, "tables": [0, 1], "cache_mb": 1, "engine": "threads"}}}]}))
    return str(path)


@pytest.mark.parametrize("command", [["tier", "rebuild"], ["serve"]])
def test_disk_full_in_serve_and_rebuild_is_one_line_exit_2(tmp_path, disk_dir, monkeypatch, capsys, command):
    disk_fills_after(monkeypatch, 64 * 1024)
    assert main([*command, "--config", tier_node_config(tmp_path, disk_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "no space left writing sdm-m1.t" in err[-1] and "needed" in err[-1], err
    assert not any("Traceback" in line for line in err), err
    assert [n for n in os.listdir(disk_dir) if not n.endswith(".tbl")] == []


def test_a_directory_at_a_table_path_is_one_line_in_serve_and_rebuild(tmp_path, disk_dir, capsys):
    config = tier_node_config(tmp_path, disk_dir)
    assert main(["tier", "rebuild", "--config", config]) == 0
    name = sorted(n for n in os.listdir(disk_dir) if n.endswith(".tbl"))[0]
    os.unlink(os.path.join(disk_dir, name))
    os.mkdir(os.path.join(disk_dir, name))
    capsys.readouterr()
    assert main(["serve", "--config", config]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"{name}: a directory, not a table file; rebuild it" in err[-1], err
    assert main(["tier", "rebuild", "--config", config]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"{name}: a directory is where this table file goes; remove it" in err[-1], err
    assert os.path.isdir(os.path.join(disk_dir, name)), "the user's directory is never removed"
