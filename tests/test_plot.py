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


def test_the_max_load_figure_marks_the_probes_that_violated_the_sla(tmp_path, monkeypatch):
    """A probe whose queries failed has an infinite tail, which draws no line: it is marked instead."""
    from recserve.measure import plot
    from recserve.measure.maxload import MaxLoadResult, Probe

    drawn: list[tuple] = []
    plt = plot.pyplot()
    real_subplots = plt.subplots

    def subplots(*args, **kwargs):
        fig, ax = real_subplots(*args, **kwargs)
        real_plot = ax.plot
        ax.plot = lambda *a, **k: drawn.append((a, k)) or real_plot(*a, **k)
        return fig, ax

    monkeypatch.setattr(plt, "subplots", subplots)
    result = MaxLoadResult(200.0, 100.0, 95.0, [Probe(100.0, 20.0, True), Probe(200.0, 60.0, True),
                                                Probe(400.0, float("inf"), False)], (200.0, 400.0), True, "bisected")
    assert plot.plot_latency_vs_load(result, tmp_path / "m.png").stat().st_size > 0
    marks = [(a, k) for a, k in drawn if k.get("label") == "probe violating the SLA"]
    assert len(marks) == 1 and list(marks[0][0][0]) == [400.0] and marks[0][0][1] == [150.0]
