"""``profile interference``: its lists and sizes are checked before anything runs, one line and exit 2."""

from __future__ import annotations

import contextlib
import io

import pytest

from recserve.cli import main


@pytest.fixture(autouse=True)
def no_measuring(monkeypatch):
    import recserve.measure.interference as interference

    monkeypatch.setattr(interference, "measure_interference", lambda *a, **k: pytest.fail("measured"))


@pytest.mark.parametrize(("extra", "said"), [
    (["--occupy", "-1"], "argument --occupy: must be comma-separated finite numbers > 0, got '-1'"),
    (["--occupy", "nan"], "argument --occupy: must be comma-separated finite numbers > 0, got 'nan'"),
    (["--table-sweep", "abc"], "argument --table-sweep: must be comma-separated finite numbers > 0, got 'abc'"),
    (["--occupy", "1e9"], "--occupy 1e+09 x the 10 MB LLC is more than half this host's memory"),
    (["--occupy", "2", "--llc-mb", "1e9"], "--occupy 2 x the 1e+09 MB LLC is more than half this host's memory"),
    (["--seconds", "1e9"], "argument --seconds: must be a finite number in (0, 60], got '1e9'"),
])
def test_bad_lists_and_sizes_are_one_line(tmp_path, extra, said):
    argv = ["profile", "interference", "--models", "hera-ncf", "--llc-mb", "10", "--out", str(tmp_path / "i.json")]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv + extra)
    assert rc == 2 and said in err.getvalue() and err.getvalue().count("\n") == 1


def test_profile_host_and_interference_hold_their_buffers_to_one_half_memory_rule(tmp_path, monkeypatch):
    """One rule (``check_half_memory``) for the microbenchmark arrays and the co-runner's buffers: on a 1 GB host
    both refuse 600 MiB, naming the same 512 MiB."""
    import recserve.hostinfo as hostinfo
    import recserve.measure.profiler as profiler
    from recserve.commands._plan_common import check_half_memory

    real = hostinfo.this_host()
    monkeypatch.setattr(hostinfo, "this_host", lambda: {**real, "mem_gb": 1.0})
    monkeypatch.setattr(profiler, "profile_host", lambda *a, **k: pytest.fail("measured"))
    check_half_memory(512, "--array-mb 512")
    said = []
    for argv in (["profile", "host", "--models", "hera-ncf", "--array-mb", "600", "--out", str(tmp_path / "h.json")],
                 ["profile", "interference", "--models", "hera-ncf", "--llc-mb", "6", "--occupy", "100",
                  "--out", str(tmp_path / "i.json")]):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            assert main(argv) == 2
        said.append(err.getvalue())
    assert all("is more than half this host's memory (512 MiB)" in line for line in said), said
