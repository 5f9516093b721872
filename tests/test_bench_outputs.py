"""``bench`` keeps what it measured: output paths checked before load, JSON before the figure, and Ctrl-C or
SIGTERM saving what completed, marked ``interrupted``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from recserve.cli import main
from recserve.commands.bench import Measured, _save
from recserve.measure.maxload import SearchInterrupted, find_max_load

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_load_is_sent(tmp_path, capsys, flag):
    blocker = tmp_path / "file"
    blocker.write_text("")
    t0 = time.monotonic()
    code = main(["bench", "--model", "hera-ncf", "--target", "http://127.0.0.1:9", "--duration", "1",
                 flag, str(blocker / "r.out")])
    err = capsys.readouterr().err
    assert code == 2 and f"{flag} {blocker / 'r.out'}: cannot be written: {blocker} is not a writable directory" in err
    assert "[bench]" not in err and time.monotonic() - t0 < 30  # refused before the pool was built or load sent


def test_the_json_is_written_before_the_figure_so_a_failing_figure_does_not_lose_it(tmp_path):
    measured = Measured(SimpleNamespace(), None, None, 10.0, 95.0)
    measured.out = {"kind": "load_run", "ok": 3}

    def draw(path):
        raise OSError(5, "figure failed", path)

    measured.draw = draw
    args = SimpleNamespace(json=str(tmp_path / "r.json"), plot=str(tmp_path / "r.png"))
    with pytest.raises(OSError):
        _save(args, measured)
    assert json.loads((tmp_path / "r.json").read_text()) == {"kind": "load_run", "ok": 3}


def test_an_interrupted_search_keeps_its_completed_probes_as_a_lower_bound():
    calls = []

    def run_at(rate):
        calls.append(rate)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return 5.0

    with pytest.raises(SearchInterrupted) as caught:
        find_max_load(run_at, 10.0, start_qps=5.0)
    result = caught.value.result
    assert [p.rate for p in result.probes] == [5.0, 10.0] and result.max_qps == 10.0 and not result.converged
    assert "interrupted after 2 probe(s)" in result.reason and type(caught.value.signal) is KeyboardInterrupt


@pytest.mark.integration
def test_sigterm_during_a_run_saves_what_completed_marked_interrupted(tmp_path):
    out, err_path, out_path = tmp_path / "r.json", tmp_path / "stderr", tmp_path / "stdout"
    # stdout and stderr go to files, each read by the test alone (two readers of one pipe split its lines)
    with open(err_path, "w") as err_file, open(out_path, "w") as out_file:
        proc = subprocess.Popen([sys.executable, "-m", "recserve.cli", "bench", "--model", "hera-ncf", "--target",
                                 "inprocess:thread", "--rate", "20", "--duration", "120", "--json", str(out)],
                                env={**os.environ, "PYTHONPATH": SRC}, stdout=out_file, stderr=err_file)
    try:
        deadline = time.monotonic() + 120
        while "sent " not in (err := err_path.read_text()) or "done 0 " in err.rsplit("[load", 1)[-1]:
            assert time.monotonic() < deadline and proc.poll() is None, err
            time.sleep(0.5)
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err_path.read_text()
    assert proc.returncode == 143 and "stopped (SIGTERM)" in err, err
    assert "offered 20.0 qps" in out_path.read_text()  # the summary of what completed
    saved = json.loads(out.read_text())
    assert saved["kind"] == "load_run" and saved["interrupted"] is True and 0 < saved["measured"] < 2400


@pytest.mark.parametrize("warmup", ["-5", "2", "5"])
def test_a_warmup_below_0_or_not_under_the_duration_is_refused(capsys, warmup):
    assert main(["bench", "--model", "hera-ncf", "--target", "http://127.0.0.1:9", "--duration", "2",
                 "--warmup", warmup]) == 2
    err = capsys.readouterr().err
    assert f"--warmup must be >= 0 and under --duration (2 s), got {warmup}" in err and "[bench]" not in err


@pytest.mark.parametrize(("ok", "failed", "status"), [(71, 218, 1), (90, 10, 0), (0, 5, 1)])
def test_a_run_where_most_queries_failed_exits_with_status_1(capsys, ok, failed, status):
    import numpy as np

    from recserve.measure.loadgen import LoadResult

    run = LoadResult(target="http t", offered_qps=20.0, duration_s=15.0, elapsed_s=15.0, sent=ok + failed,
                     latencies_ms=np.full(ok, 5.0), errors={"connection": failed}, measured=ok + failed)
    args = SimpleNamespace(scale=1e-3, sizes="production", index="uniform", rate=20.0, target="http://x",
                           served_name="")
    measured = Measured(args, SimpleNamespace(name="m"), SimpleNamespace(name="http t"), 20.0, 95.0)
    measured.run(run)
    assert measured.failed == status


@pytest.mark.parametrize(("errors", "words", "not_words"), [
    ({"http_500": 24}, "the server failed queries with server errors", "refused"),
    ({"grpc_UNAVAILABLE": 9}, "the server refused queries", "server errors"),
])
def test_server_errors_are_not_called_refusals(capsys, errors, words, not_words):
    import numpy as np

    from recserve.measure.loadgen import LoadResult

    n = sum(errors.values())
    run = LoadResult(target="http t", offered_qps=20.0, duration_s=5.0, elapsed_s=5.0, sent=100 + n,
                     latencies_ms=np.full(100, 5.0), errors=errors, measured=100 + n,
                     refusal_reasons={"internal failure N": n})
    args = SimpleNamespace(scale=1e-3, sizes="production", index="uniform", rate=20.0, target="http://x",
                           served_name="")
    Measured(args, SimpleNamespace(name="m"), SimpleNamespace(name="http t"), 20.0, 95.0).run(run)
    err = capsys.readouterr().err
    assert f"[bench] {words}: internal failure N (x{n})" in err and not_words not in err
