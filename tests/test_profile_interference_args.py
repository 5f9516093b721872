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
