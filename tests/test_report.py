from __future__ import annotations

import base64
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from recserve.cli import main  # noqa: E402
from recserve.demo import diurnal_rates, plot_live  # noqa: E402


def _png(path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig(path)
    plt.close(fig)
    return path


def test_report_embeds_scalars_and_named_figures(tmp_path):
    png = _png(tmp_path / "fig.png")
    result = tmp_path / "bench.json"
    result.write_text(json.dumps({"max_qps": 123.5, "model": "m", "plot": str(png), "nested": {"x": [1, 2]}}))
    out = tmp_path / "r.html"
    assert main(["report", str(result), "--out", str(out)]) == 0
    html = out.read_text()
    assert "123.5" in html and "data:image/png;base64," in html and "bench.json" in html


def test_demo_live_results_render_with_their_figure(tmp_path):
    windows = [{"t_s": 3.0 * i, "model": m, "offered_qps": 5.0, "achieved_qps": 4.0, "p95_ms": 50.0 + i,
                "sla_ms": 100.0, "errors": 3 * (i == 4), "workers": 1 + i % 2} for i in range(6) for m in ("a", "b")]
    windows[8]["p95_ms"] = float("nan")  # a window whose queries all failed has no p95
    live = {"kind": "demo-live", "models": ["a", "b"], "windows": windows, "peak_qps": {"a": 5.0, "b": 5.0},
            "window_s": 3.0,
            "violation_fraction": {"a": 0.0, "b": 0.0},
            "decisions": [{"time_s": 3.0, "model": "a", "action": "workers", "detail": {"workers": 2}}],
            "held": [{"time_s": 6.0, "model": "b", "action": "held (starved by a neighbour)",
                      "detail": {"starved_by": "a"}}]}
    (tmp_path / "live.json").write_text(json.dumps(live))
    plot_live(live, tmp_path / "live.png")
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "live.json"), "--out", str(out)]) == 0
    html = out.read_text()
    assert "Resource-manager decisions" in html and html.count("data:image/png") == 1
    assert "held (starved by a neighbour)" in html


def test_diurnal_rates_peak_in_the_evening_of_the_compressed_day():
    rates = diurnal_rates(30.0, 24, ratio=3.0)
    assert rates.max() <= 30.0 + 1e-9 and rates.min() >= 10.0 - 1e-9
    assert 10 <= int(rates.argmax()) <= 14  # 20:00 in a day that starts at 08:00


def test_a_missing_or_unreadable_result_file_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "fleet.yaml").write_text("models: []\n")
    assert main(["report", str(tmp_path / "nonexistent.json"), "--out", str(tmp_path / "r.html")]) == 2
    assert f"{tmp_path / 'nonexistent.json'}: no such result file" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "fleet.yaml"), "--out", str(tmp_path / "r.html")]) == 2
    assert f"{tmp_path / 'fleet.yaml'}: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_each_live_run_embeds_its_own_figure(tmp_path):
    windows = [{"t_s": 3.0, "model": "a", "offered_qps": 5.0, "achieved_qps": 4.0, "p95_ms": 50.0, "sla_ms": 100.0,
                "errors": 0, "workers": 1}]
    live = {"kind": "demo-live", "models": ["a"], "windows": windows, "peak_qps": {"a": 5.0}, "window_s": 3.0,
            "violation_fraction": {"a": 0.0}, "decisions": []}
    _png(tmp_path / "live.png")
    (tmp_path / "live_static.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"static-run-figure")
    (tmp_path / "live_static.json").write_text(json.dumps({**live, "controller": "static"}))
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "live_static.json"), "--out", str(out)]) == 0
    embedded = out.read_text().split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(embedded) == (tmp_path / "live_static.png").read_bytes()


def test_only_real_pngs_in_the_results_folder_are_embedded(tmp_path):
    (tmp_path / "secret.png").write_text("TOPSECRET-not-a-png")
    inner = tmp_path / "run"
    inner.mkdir()
    outside = _png(tmp_path / "outside.png")
    (inner / "fake.png").write_text("also-not-a-png")
    _png(inner / "fig.png")
    (inner / "r.json").write_text(json.dumps({"a": "../secret.png", "b": str(outside), "c": "fake.png",
                                              "d": "fig.png"}))
    out = tmp_path / "r.html"
    assert main(["report", str(inner / "r.json"), "--out", str(out)]) == 0
    html = out.read_text()
    embedded = [base64.b64decode(x.split('"')[0]) for x in html.split("data:image/png;base64,")[1:]]
    assert embedded == [(inner / "fig.png").read_bytes()]


def test_live_results_are_written_as_standard_json_and_still_render(tmp_path):
    from recserve.demo import strict_json

    data = {"kind": "demo-live", "models": ["a"], "peak_qps": {"a": 5.0}, "violation_fraction": {"a": 1.0},
            "decisions": [], "slack": float("inf"),
            "windows": [{"t_s": 3.0, "model": "a", "offered_qps": 5.0, "achieved_qps": 0.0, "p95_ms": float("nan"),
                         "sla_ms": 100.0, "errors": 15, "workers": 1}]}
    text = json.dumps(strict_json(data), allow_nan=False)
    assert json.loads(text)["windows"][0]["p95_ms"] is None and json.loads(text)["slack"] is None
    (tmp_path / "live.json").write_text(text)
    assert main(["report", str(tmp_path / "live.json"), "--out", str(tmp_path / "r.html")]) == 0
