"""measure/plot.py's ``pyplot``: matplotlib is optional (the ``report`` extra); a figure without it is one line."""

from __future__ import annotations

import sys

import pytest

from recserve.cli import main
from recserve.errors import RecserveError
from recserve.measure.plot import pyplot


def test_pyplot_draws_on_the_agg_backend():
    plt = pytest.importorskip("matplotlib.pyplot")
    assert pyplot() is plt and plt.get_backend().lower() == "agg"


def test_without_matplotlib_a_plot_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(RecserveError, match=r"recserve\[report\]"):
        pyplot()
    argv = ["workload", "sample", "--dist", "production", "--n", "100", "--plot", str(tmp_path / "h.png")]
    assert main(argv) == 2
    assert capsys.readouterr().err == "recserve: error: figures need matplotlib: pip install 'recserve[report]'\n"
    assert not (tmp_path / "h.png").exists()
