"""``simulate dispatch --pool`` reads the pool that ``plan pool --json`` wrote."""

from __future__ import annotations

import contextlib
import io
import json

from recserve.cli import main


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


def test_simulate_dispatch_simulates_the_planned_pool(tmp_path):
    plan, out = tmp_path / "pool.json", tmp_path / "sim.json"
    assert run(["plan", "pool", "--reference", "kairos", "--models", "kairos-rm2", "--json", str(plan)])[0] == 0
    rc, err = run(["simulate", "dispatch", "--reference", "kairos", "--model", "rm2", "--pool", str(plan),
                   "--policies", "kairos", "--queries", "300", "--no-homogeneous", "--json-out", str(out)])
    assert rc == 0, err
    planned = json.loads(plan.read_text())["pools"][0]["config"]
    result = json.loads(out.read_text())["results"][0]
    assert result["pool_source"]["config"] == planned
    assert result["pool"] == ",".join(f"{k}={v}" for k, v in planned.items() if v)


def test_a_plan_of_another_kind_or_model_is_named(tmp_path):
    plan = tmp_path / "pool.json"
    assert run(["plan", "pool", "--reference", "kairos", "--models", "kairos-rm2", "--json", str(plan)])[0] == 0
    rc, err = run(["simulate", "dispatch", "--reference", "kairos", "--model", "wnd", "--pool", str(plan)])
    assert rc == 2 and err.strip() == f"recserve: error: --pool {plan}: no pool for 'kairos-wnd'; it plans " \
                                      "['kairos-rm2']"
    other = tmp_path / "tier.json"
    assert run(["plan", "tier", "--model", "hera-ncf", "--dram-gb", "1", "--qps", "10", "--out", str(other)])[0] == 0
    rc, err = run(["simulate", "dispatch", "--reference", "kairos", "--model", "rm2", "--pool", str(other)])
    assert rc == 2 and "a tier plan, not a pool plan" in err


def test_a_run_stopped_while_writing_json_out_leaves_the_earlier_file(tmp_path, monkeypatch):
    import recserve.jsonio

    out = tmp_path / "sim.json"
    out.write_text('{"earlier": true}')

    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(recserve.jsonio.os, "replace", stopped)
    rc, _ = run(["simulate", "dispatch", "--reference", "kairos", "--model", "rm2", "--pool", "g4dn.xlarge=1",
                 "--policies", "kairos", "--queries", "200", "--no-homogeneous", "--json-out", str(out)])
    assert rc == 130 and json.loads(out.read_text()) == {"earlier": True}
    assert [p.name for p in tmp_path.iterdir()] == ["sim.json"]
