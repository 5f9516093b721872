"""SSD-tier faults: a block corrupted while serving fails the query (never scores), a file swapped under a worker
is refused when the worker reopens it, a bad file at start is one line and exit 2, and one command rebuilds it."""

from __future__ import annotations

import os
import pickle
import types

import numpy as np
import pytest
import torch
import yaml

from recserve.cli import main
from recserve.embedding.tablefile import TableFileError, read_header, write_table
from recserve.embedding.tiered import TableChecksumError, TieredTable, TierResources, open_errors, tier_model
from recserve.errors import RecserveError
from recserve.serving.worker.main import _refuse_unservable
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.zoo import DramTable, build, sample_batch
from tests.support import http
from tests.support.nodes import generous
from tests.support.scrape import metric_value, scrape
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


def corrupt(path: str, offset: int, data: bytes = b"\xff\xff\xff\xff") -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def test_block_corrupted_while_serving_fails_the_query_and_is_counted(disk_dir):
    torch.manual_seed(0)
    dram = DramTable(4000, 16)
    path = os.path.join(disk_dir, "live.tbl")
    write_table(path, dram.weight)
    table = TieredTable(path, TierResources(None, engine="threads"), use_cache=False, name="user_ids")
    header = read_header(path)
    corrupt(path, header.data_offset + 1234 * header.stride)  # row 1234, after the open-time check
    offsets = torch.tensor([0])
    with pytest.raises(TableChecksumError, match=r"table user_ids: checksum mismatch in row 1234 \(block \d+"):
        table.pool(torch.tensor([7, 1234, 99]), offsets)
    assert table.stats.checksum_errors == 1
    fine = torch.tensor([7, 99])
    assert torch.equal(table.pool(fine, offsets), dram.pool(fine, offsets)), "other rows still serve exactly"
    table.close()


def small_dlrm(name: str, second: TableSpec) -> ModelSpec:
    """A two-table DLRM whose first table (u0, 3000x16) is the one tiered to SSD."""
    return ModelSpec(name, "dlrm", 8, (TableSpec("u0", 3000, 16, pooling=8, side="user"), second), "dot", SLA(50.0),
                     bottom_mlp=(32, 16), top_mlp=(16, 1))


def test_corrupt_rows_never_reach_the_row_cache_or_the_scores(disk_dir):
    spec = small_dlrm("sdm-fault", TableSpec("i0", 500, 16, pooling=2, side="item"))
    model = build(spec, scale=1.0)
    tier_model(model, [0], disk_dir, cache_bytes=1 << 20)
    table = model.tables[0]
    batch = sample_batch(model, 16, rng=1)
    nan_rows = b"\x00\x00\xc0\x7f" * (table.header.rows * table.header.stride // 4)
    corrupt(str(table.path), table.header.data_offset, nan_rows)  # every row now decodes to NaN
    with torch.no_grad():
        with pytest.raises(TableChecksumError, match="table u0"):
            model(batch)
        with pytest.raises(TableChecksumError):
            model(batch)  # again: nothing corrupt was cached by the failed query
    assert table.resources.row_cache.lookup(np.arange(3000, dtype=np.int64)).max() < 0


def test_worker_reopen_after_file_swap_is_refused(disk_dir):
    torch.manual_seed(1)
    first, other = DramTable(2000, 16), DramTable(2000, 16)
    path = os.path.join(disk_dir, "t.tbl")
    write_table(path, first.weight)
    table = TieredTable(path, TierResources(None, engine="threads"), name="u0")
    shipped = pickle.dumps(table)  # what the server sends a (re)starting worker
    assert pickle.loads(shipped).fingerprint == table.fingerprint  # unchanged file: reopens fine
    write_table(path, other.weight)  # same shape, other contents, same path (a rename over it)
    reopened = pickle.loads(shipped)  # as a worker's bootstrap does: kept, for the worker to say why
    with pytest.raises(TableFileError, match="changed since the server opened it"):
        reopened.reader  # noqa: B018 - any read refuses the file
    model = types.SimpleNamespace(tables=[reopened])
    assert open_errors(model) == [reopened.open_error] and "rebuild it" in reopened.open_error
    with pytest.raises(RecserveError, match="table u0: t.tbl changed since the server opened it"):
        _refuse_unservable(model)  # the worker's start: one line to the supervisor, which logs it
    table.close()


def test_tier_model_refuses_a_file_of_other_weights_or_shape(disk_dir):
    spec = small_dlrm("sdm-swap", TableSpec("u1", 1000, 16, pooling=4, side="user"))
    model = build(spec, scale=1.0)
    tier_model(model, [0, 1], disk_dir, cache_bytes=0)
    paths = [model.tables[t].path for t in (0, 1)]
    for t in (0, 1):
        model.tables[t].close()
    os.replace(paths[1], paths[0])  # table 1's file (1000 rows) under table 0's name
    with pytest.raises(TableFileError, match=r"table u0: .* holds 1000x16 rows, the model's table is 3000x16"):
        tier_model(build(spec, scale=1.0), [0], disk_dir, cache_bytes=0)


def node_config(tmp_path, tier_dir) -> str:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"http_port": 0, "grpc_port": 0, "models": [{
        "model": "sdm-m1", "scale": 2e-5, "workers": 1, "max_batch_size": 64,
        "options": {"tier": {"dir": str(tier_dir), "tables": [0, 1], "cache_mb": 1, "engine": "threads"}}}]}))
    return str(path)


def test_bad_file_at_start_is_one_line_exit_2_and_rebuild_fixes_it(tmp_path, disk_dir, capsys):
    config = node_config(tmp_path, disk_dir)
    assert main(["tier", "rebuild", "--config", config]) == 0
    assert "0 valid, 2 (re)written" in capsys.readouterr().out
    files = sorted(p for p in os.listdir(disk_dir) if p.endswith(".tbl"))
    header = read_header(os.path.join(disk_dir, files[0]))
    corrupt(os.path.join(disk_dir, files[0]), header.data_offset + 100)
    assert main(["serve", "--config", config]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "checksum mismatch" in err[-1] and "recserve tier rebuild" in err[-1], err
    assert main(["tier", "rebuild", "--config", config]) == 0
    out = capsys.readouterr().out
    assert f"1 valid, 1 (re)written from DRAM: {files[0]}" in out and "once its workers are replaced" in out
    assert main(["tier", "rebuild", "--config", config]) == 0
    out = capsys.readouterr().out
    assert "2 valid, 0 (re)written" in out and "once its workers are replaced" not in out


def _infer(port: int, batch, timeout_s: float) -> tuple[object, bytes]:
    """(status, body) of a plain-JSON query; a timeout or a reset is "no answer", which is not scores either."""
    try:
        reply = http.post_json(port, "/v2/models/sdm-m1/infer", http.json_infer_body(batch.as_arrays()),
                               timeout_s=timeout_s)
    except OSError as e:
        return "no answer", repr(e).encode()
    return reply.status, reply.body


def test_served_corruption_is_an_error_and_a_swapped_file_is_never_served(tmp_path, disk_dir, start_node):
    import signal
    import time

    from recserve.serving import config_from_dict
    from recserve.specs import get_model

    model = generous({"model": "sdm-m1", "scale": 2e-5, "workers": 1, "max_batch_size": 64,
                      "options": {"tier": {"dir": disk_dir, "tables": [0, 1], "cache_mb": 0, "engine": "threads"}}})
    config = config_from_dict({"models": [model]})
    reference = build(get_model("sdm-m1"), scale=2e-5)
    ports = start_node(config, drain=False).ports
    status, _ = _infer(ports.http, sample_batch(reference, 8, rng=1), 60)
    assert status == 200
    path = sorted(p for p in (os.path.join(disk_dir, f) for f in os.listdir(disk_dir)) if p.endswith(".tbl"))[0]
    header = read_header(path)
    corrupt(path, header.data_offset, b"\x00\x00\xc0\x7f" * (header.data_bytes // 4))
    status, body = _infer(ports.http, sample_batch(reference, 8, rng=2), 60)
    assert status == 500 and b"table user0: checksum mismatch in row" in body and b"block" in body, body
    counted = until(lambda: metric_value(scrape(ports.http), "recserve_request_errors_total", model="sdm-m1",
                                         version="1", code="data_loss"),
                    bool)  # workers report their failures in short batches, later on a busy host
    assert counted == 1
    # swap the file under the same name, then kill the worker: the restarted worker must refuse it
    write_table(path, np.random.default_rng(0).standard_normal((header.rows, header.dim)).astype(np.float32))
    pid = http.get_json(ports.http, "/control/models/sdm-m1")["stages"]["model"]["worker_detail"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    time.sleep(1.0)
    # wait for the answer (503 once the restarts give up, ~10 s): a query left queued would hold the
    # server's shutdown for its 60 s grace period; every restart attempt in between is watched
    status, body = _infer(ports.http, sample_batch(reference, 8, rng=3), 60)
    assert status != 200, "a worker served the swapped file"
    # the restarts go on, backing off: once the file is rebuilt, the next one serves it
    assert main(["tier", "rebuild", "--config", node_config(tmp_path, disk_dir)]) == 0
    deadline = time.monotonic() + 120
    while (status := _infer(ports.http, sample_batch(reference, 8, rng=4), 60)[0]) != 200 \
            and time.monotonic() < deadline:
        time.sleep(1.0)
    assert status == 200


def test_a_serving_node_reads_rebuilt_files_once_its_workers_are_replaced(tmp_path, disk_dir, start_node, capsys):
    """The recovery `recserve tier rebuild` prints: corrupt files rewritten, then the workers replaced through the
    control API (same count, ``replace``) serve the rewritten files; a plain same-count resize changes nothing."""
    from recserve.serving import config_from_dict
    from recserve.specs import get_model

    config_path = node_config(tmp_path, disk_dir)
    served = yaml.safe_load(open(config_path))
    served["models"] = [generous(m) for m in served["models"]]
    reference = build(get_model("sdm-m1"), scale=2e-5)
    ports = start_node(config_from_dict(served), drain=False).ports
    assert _infer(ports.http, sample_batch(reference, 8, rng=1), 60)[0] == 200
    path = sorted(os.path.join(disk_dir, f) for f in os.listdir(disk_dir) if f.endswith(".tbl"))[0]
    header = read_header(path)
    corrupt(path, header.data_offset, b"\x00\x00\xc0\x7f" * (header.data_bytes // 4))
    assert _infer(ports.http, sample_batch(reference, 8, rng=2), 60)[0] == 500
    assert main(["tier", "rebuild", "--config", config_path]) == 0
    assert '"replace": true' in capsys.readouterr().out

    def pids() -> list[int]:
        state = http.get_json(ports.http, "/control/models/sdm-m1")
        return [w["pid"] for w in state["stages"]["model"]["worker_detail"]]

    before = pids()
    assert http.post_json(ports.http, "/control/models/sdm-m1/workers", {"workers": 1}, timeout_s=120).status == 200
    assert pids() == before  # the same count alone keeps the workers (and their open files)
    assert _infer(ports.http, sample_batch(reference, 8, rng=3), 60)[0] == 500
    reply = http.post_json(ports.http, "/control/models/sdm-m1/workers", {"workers": 1, "replace": True},
                           timeout_s=120)
    assert reply.status == 200 and len(pids()) == 1 and not set(pids()) & set(before)
    status, body = _infer(ports.http, sample_batch(reference, 8, rng=4), 60)
    assert status == 200, body


def test_the_tiers_counters_are_in_the_nodes_metrics(disk_dir, start_node):
    """What the tier planner predicted, seen live: lookups, cache hits and misses, reads and bytes read, checksum
    failures, per model version."""
    import time

    from recserve.serving import config_from_dict
    from recserve.specs import get_model

    model = generous({"model": "sdm-m1", "scale": 2e-5, "workers": 1, "max_batch_size": 64,
                      "options": {"tier": {"dir": disk_dir, "tables": [0, 1], "cache_mb": 1, "engine": "threads"}}})
    ports = start_node(config_from_dict({"models": [model]}), drain=False).ports
    reference = build(get_model("sdm-m1"), scale=2e-5)
    for rng in range(4):
        assert _infer(ports.http, sample_batch(reference, 8, rng=rng), 60)[0] == 200

    def counted(name: str) -> float:
        return metric_value(scrape(ports.http), f"recserve_tier_{name}_total", model="sdm-m1", version="1") or 0.0

    deadline = time.monotonic() + 30  # reported each heartbeat
    while counted("lookups") == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert counted("lookups") > 0 and counted("misses") > 0 and counted("ios") > 0 and counted("bytes_read") > 0
    assert counted("checksum_errors") == 0
