"""Issue #18: the perfmodel on the Kairos EC2 latencies, and the mechanisms that got it there.

The bound is the issue's target (median absolute error <= 35 %, mean Spearman >= 0.9) with the bundled
constants, none fitted to the Kairos data; before the fix the check gave a 60 % median.  Runs in a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recserve.errors import SpecError
from recserve.perfmodel import Allocation, PerfModel, load_calibration
from recserve.perfmodel.calibration import calibration_from_dict
from recserve.perfmodel.cost import model_cost
from recserve.specs import catalogue_models, catalogue_servers


def test_kairos_ec2_check_meets_issue_target():
    from benchmarks.common.perfmodel_checks import kairos_check

    k = kairos_check(Path("/nonexistent"))  # bundled constants
    assert k["fitted_to_kairos"] is False
    assert k["median_ape_all"] <= 35.0, k["median_ape_all"]
    assert k["mean_spearman"] >= 0.9, k["mean_spearman"]


def _feed_delta(spec_name: str, server_name: str, batch: int) -> float:
    pm = PerfModel()
    spec, server = catalogue_models()[spec_name], catalogue_servers()[server_name]
    base = Allocation(workers=1, cores_per_worker=1)
    pylist = Allocation(workers=1, cores_per_worker=1, feed="pylist")
    return pm.call_ms(spec, server, batch, pylist) - pm.call_ms(spec, server, batch, base)


def test_pylist_feed_costs_per_id_and_per_table_at_the_server_clock():
    cal = load_calibration()
    cost = model_cost(catalogue_models()["kairos-rm2"])
    tables = len(cost.table_lookups)
    server = catalogue_servers()["r5n.large"]
    batch = 100
    expect = ((cost.lookups_per_item * cal.feed_pyint_ns + tables * cal.feed_npscalar_ns) * batch * 1e-6
              + 2 * tables * cal.feed_call_us * 1e-3) * cal.feed_ref_ghz / server.freq_ghz
    assert _feed_delta("kairos-rm2", "r5n.large", batch) == pytest.approx(expect, rel=1e-9)
    # linear in the ids: 3840 per RM2 item make it dominate; a faster clock shortens it
    assert _feed_delta("kairos-rm2", "r5n.large", 1000) > 9 * _feed_delta("kairos-rm2", "r5n.large", 100)
    assert _feed_delta("kairos-rm2", "c5n.2xlarge", batch) < _feed_delta("kairos-rm2", "r5n.large", batch)


def test_pylist_feed_is_stretched_on_burstable_and_pays_a_copy_per_array_on_gpu():
    cal = load_calibration()
    servers = catalogue_servers()
    t3, r5n = servers["t3.xlarge"], servers["r5n.large"]
    assert t3.cpu_share < 1 and t3.freq_ghz == r5n.freq_ghz
    # same clock, t3 at its sustained share: the interpreter-bound feed stretches by 1/cpu_share
    assert _feed_delta("kairos-wnd", "t3.xlarge", 200) == pytest.approx(
        _feed_delta("kairos-wnd", "r5n.large", 200) / t3.cpu_share, rel=1e-9)
    # g4dn (same 2.5 GHz host CPU as r5n): plus one host-to-device copy per converted array and the dense input
    tables = len(model_cost(catalogue_models()["kairos-wnd"]).table_lookups)
    assert _feed_delta("kairos-wnd", "g4dn.xlarge", 200) == pytest.approx(
        _feed_delta("kairos-wnd", "r5n.large", 200) + (2 * tables + 1) * cal.pcie_latency_us * 1e-3, rel=1e-9)


def test_tensor_feed_is_the_default_and_bad_feed_is_refused():
    assert Allocation().feed == "tensor"
    assert _feed_delta("kairos-ncf", "c5n.2xlarge", 10) > 0
    with pytest.raises(SpecError):
        Allocation(feed="json")


def test_calibration_files_without_feed_constants_still_load():
    data = load_calibration().to_dict()
    for k in ("feed_pyint_ns", "feed_npscalar_ns", "feed_call_us", "feed_ref_ghz"):
        data["constants"].pop(k)
    cal = calibration_from_dict(json.loads(json.dumps(data)))
    assert cal.feed_pyint_ns > 0 and cal.feed_ref_ghz > 0


def test_kairos_dien_is_the_deeprecsys_layout():
    """43 tables of one id each (DeepRecSys dien.json); tables 1..40 form a 40-step behaviour sequence."""
    spec = catalogue_models()["kairos-dien"]
    cost = model_cost(spec)
    assert cost.lookups_per_item == 43
    assert [t.pooling for t in spec.sequence_tables] == [40]
    assert cost.emb_bytes == pytest.approx((41 * 500_000 + 2 * 5_000_000) * 32 * 4)
