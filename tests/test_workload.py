"""Workload generators: size mixes, arrivals, index skew, diurnal traces; seeds, files and the CLI."""

from __future__ import annotations

import numpy as np
import pytest

from recserve.cli import main
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.workload import (
    DiurnalTrace,
    LocalitySampler,
    QueryTrace,
    WorkloadError,
    ZipfSampler,
    diurnal_trace,
    index_sampler,
    load_sizes,
    measure_locality,
    poisson_arrivals,
    production_query_sizes,
    production_size_pmf,
    query_trace,
    save_sizes,
    size_distribution,
    summarize,
    zipf_alpha_for_locality,
    zipf_locality,
)

# ----------------------------------------------------------------- query sizes

# Observed over 20k samples of the Kairos/DeepRecSys mix (reference/README.md).
REFERENCE = {"mean": 244, "median": 180, "p90": 520, "p99": 920}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_production_mix_reproduces_reference_percentiles(seed):
    stats = summarize(size_distribution("production").sample(20000, seed))
    for key, want in REFERENCE.items():
        assert abs(stats[key] - want) <= 0.05 * want, (key, stats[key])
    assert stats["min"] >= 1 and stats["max"] <= 1000


def test_production_sizes_are_multiples_of_ten_and_match_the_exact_pmf():
    sizes = production_query_sizes(200000, seed=5)
    assert np.all(sizes % 10 == 0)
    grid, pmf = production_size_pmf()
    assert pmf.sum() == pytest.approx(1.0)
    empirical = np.bincount(sizes // 10 - 1, minlength=len(grid))[: len(grid)] / sizes.size
    assert np.abs(empirical - pmf).max() < 0.004
    assert float((grid * pmf).sum()) == pytest.approx(sizes.mean(), rel=0.01)


@pytest.mark.parametrize("spec", ["production", "lognormal:mu=5.1,sigma=0.2", "normal:mean=256,sd=32", "fixed:64"])
def test_same_seed_same_sizes_other_seed_differs(spec):
    dist = size_distribution(spec)
    a, b = dist.sample(5000, 7), dist.sample(5000, 7)
    assert a.dtype == np.int64 and np.array_equal(a, b)
    if not spec.startswith("fixed"):
        assert not np.array_equal(a, dist.sample(5000, 8))


def test_lognormal_and_normal_are_clipped_and_parameterised():
    wide = size_distribution("lognormal", mu=6.5, sigma=1.5).sample(20000, 0)
    assert wide.min() >= 1 and wide.max() <= 1024 and (wide == 1024).any()
    normal = size_distribution("normal:mean=165,sd=16").sample(20000, 0)
    assert abs(normal.mean() - 165) < 1 and abs(normal.std() - 16) < 1
    lognormal = size_distribution("lognormal:mu=5.1,sigma=0.2").sample(20000, 0)
    assert abs(np.median(lognormal) - np.exp(5.1)) < 3  # median of lognormal(5.1, 0.2) is e^5.1 ≈ 164


@pytest.mark.parametrize("suffix", [".npy", ".txt"])
def test_sizes_round_trip_through_files_and_file_distribution(tmp_path, suffix):
    sizes = size_distribution("production").sample(1000, 3)
    path = save_sizes(tmp_path / f"sizes{suffix}", sizes)
    assert np.array_equal(load_sizes(path), sizes)
    drawn = size_distribution(f"file:{path}").sample(4000, 0)
    assert set(np.unique(drawn)) <= set(np.unique(sizes))
    assert np.array_equal(drawn, size_distribution(f"file:{path}").sample(4000, 0))


@pytest.mark.parametrize("spec, message", [
    ("bogus", "unknown query-size distribution"),
    ("normal:mean=x", "not a number"),
    ("lognormal:mu=5,foo=1", "unknown parameter"),
    ("fixed:0", "positive integer"),
    ("fixed", "needs a size"),
    ("lognormal:sigma=-1", "sigma must be >= 0"),
    ("normal:mean=-5", r"mean must be within \[lo, hi\] = \[1, 1024\] items, got -5"),
    ("file:/no/such/sizes.npy", "no such file"),
])
def test_bad_size_specs_raise_one_clear_error(spec, message):
    with pytest.raises(WorkloadError, match=message):
        size_distribution(spec).sample(10, 0)


def test_text_size_file_with_garbage_is_rejected(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("10\n-5\n")
    with pytest.raises(WorkloadError, match="positive integers"):
        load_sizes(path)


# ----------------------------------------------------------------- arrivals


def test_poisson_arrivals_have_exponential_gaps():
    times = poisson_arrivals(200.0, n=50000, rng=1)
    gaps = np.diff(times, prepend=0.0)
    assert np.all(gaps >= 0) and np.all(np.diff(times) >= 0)
    assert gaps.mean() == pytest.approx(1 / 200, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # exponential: cv = 1
    assert np.array_equal(times, poisson_arrivals(200.0, n=50000, rng=1))


def test_integer_ms_variant_reproduces_deeprecsys_gaps():
    times = poisson_arrivals(100.0, n=20000, rng=2, integer_ms=True)
    gaps_ms = np.diff(times, prepend=0.0) * 1000
    assert np.allclose(gaps_ms, np.round(gaps_ms))
    assert gaps_ms.mean() == pytest.approx(10.0, rel=0.02)
    assert gaps_ms.var() == pytest.approx(10.0, rel=0.05)  # Poisson: variance = mean


def test_arrivals_by_duration_stay_inside_it():
    times = poisson_arrivals(1000.0, duration_s=5.0, rng=0)
    assert times.max() <= 5.0 and abs(times.size - 5000) < 4 * np.sqrt(5000)


def test_query_trace_round_trips_and_keeps_sizes_when_rate_changes(tmp_path):
    trace = query_trace(300.0, 2000, seed=4)
    for suffix in (".csv", ".npz"):
        again = QueryTrace.load(trace.save(tmp_path / f"q{suffix}"))
        assert np.allclose(again.arrival_s, trace.arrival_s) and np.array_equal(again.sizes, trace.sizes)
    assert np.array_equal(query_trace(600.0, 2000, seed=4).sizes, trace.sizes)


# ----------------------------------------------------------------- embedding indices


@pytest.mark.parametrize("p", [0.5, 0.9])
@pytest.mark.parametrize("hot", ["scattered", "first"])
def test_locality_measured_within_two_points(p, hot):
    rows, n = 10000, 100000
    sampler = LocalitySampler(p=p, hot=hot)
    idx = sampler(rows, n, np.random.default_rng(11))
    assert idx.dtype == np.int64 and idx.min() >= 0 and idx.max() < rows
    assert abs(measure_locality(idx, rows) - p) <= 0.02
    if hot == "first":
        assert abs(np.mean(idx < rows // 10) - p) <= 0.02


def test_scattered_hot_rows_are_a_fixed_permutation():
    sampler = LocalitySampler(p=0.9, perm_seed=3)
    for rows in (10, 9973, 20_000_000, 600_000_000):
        ranks = np.arange(min(rows, 1000))
        row_ids = sampler.rank_to_row(ranks, rows)
        assert np.unique(row_ids).size == ranks.size and row_ids.max() < rows
        assert np.array_equal(sampler.row_rank(row_ids, rows), ranks)
    hot_a = LocalitySampler(p=1.0, perm_seed=3)(1000, 500, np.random.default_rng(0))
    hot_b = LocalitySampler(p=1.0, perm_seed=3)(1000, 500, np.random.default_rng(1))
    assert set(hot_a) | set(hot_b) == set(sampler.rank_to_row(np.arange(100), 1000))
    assert np.unique(hot_a).size <= 100 and hot_a.max() > 100  # hot, yet not the first rows


def test_zipf_matches_its_analytic_locality_and_head_pmf():
    rows, alpha = 200_000, 1.0
    sampler = ZipfSampler(alpha=alpha, hot="first", head=1000)  # small head: exercises the tail path
    idx = sampler(rows, 200000, np.random.default_rng(5))
    assert abs(np.mean(idx < rows // 10) - zipf_locality(alpha, rows)) < 0.01
    pmf = np.arange(1, rows + 1, dtype=float) ** -alpha
    pmf /= pmf.sum()
    observed = np.bincount(idx, minlength=rows) / idx.size
    assert abs(observed[0] - pmf[0]) < 0.003
    assert abs(observed[1000:5000].sum() - pmf[1000:5000].sum()) < 0.005  # tail approximation


def test_zipf_alpha_for_a_locality_round_trips():
    alpha = zipf_alpha_for_locality(0.9, 10000)
    idx = ZipfSampler(alpha=alpha)(10000, 100000, np.random.default_rng(0))
    assert abs(measure_locality(idx, 10000) - 0.9) <= 0.02


def test_index_sampler_registry_plugs_into_the_zoo_batch():
    from recserve.zoo.batch import random_batch

    sampler = index_sampler("locality:p=0.9", hot="first")
    batch = random_batch(4, (1000, 50), (20, 1), 64, rng=0, sampler=sampler)
    batch.validate(4, (1000, 50))
    indices, _ = batch.table(0)
    assert np.mean(indices.numpy() < 100) > 0.8
    again = random_batch(4, (1000, 50), (20, 1), 64, rng=0, sampler=sampler)
    assert np.array_equal(batch.values.numpy(), again.values.numpy())
    with pytest.raises(WorkloadError):
        index_sampler("locality:p=1.5")
    with pytest.raises(WorkloadError):
        index_sampler("pareto:a=1")
    assert index_sampler("uniform", hot="first", seed=2)(10, 5, np.random.default_rng(0)).max() < 10


def test_sampler_works_with_sample_batch_on_a_built_model():
    from recserve.zoo import build, sample_batch

    spec = ModelSpec(name="tiny", family="dlrm", dense_in=4, bottom_mlp=(8,), top_mlp=(4, 1), interaction="dot",
                     tables=(TableSpec("a", 5000, 8, 10), TableSpec("b", 300, 8, 2)), sla=SLA(10))
    model = build(spec, scale=1.0)
    batch = sample_batch(model, 32, np.random.default_rng(0), sampler=index_sampler("zipf:alpha=1.2"))
    model.validate(batch)
    assert model(batch).shape == (32, 1)


# ----------------------------------------------------------------- diurnal traces


def test_diurnal_trace_shape_and_synchrony():
    trace = diurnal_trace({"a": 1000.0, "b": 200.0}, hours=24, step_min=15, peak_valley_ratio=2.0,
                          peak_hour=20, noise=0.0, seed=0)
    assert trace.times_s.size == 96 and trace.step_s == 900
    a, b = trace.series("a"), trace.series("b")
    assert np.allclose(a / 1000.0, b / 200.0)  # synchronous: same shape for every model
    assert a.max() / a.min() == pytest.approx(2.0, rel=0.01)
    assert abs(trace.times_s[a.argmax()] / 3600 - 20) <= 0.25 and abs(trace.times_s[a.argmin()] / 3600 - 8) <= 0.25
    noisy = diurnal_trace({"a": 1000.0, "b": 200.0}, noise=0.05, seed=1)
    again = diurnal_trace({"a": 1000.0, "b": 200.0}, noise=0.05, seed=1)
    assert np.array_equal(noisy.series("a"), again.series("a"))
    rel = noisy.series("a") / a - 1
    assert 0.03 < rel.std() < 0.07


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_trace_round_trips(tmp_path, suffix):
    trace = diurnal_trace({"rmc1": 5e4, "rmc2": 3e4}, hours=48, step_min=30, seed=2)
    again = DiurnalTrace.load(trace.save(tmp_path / f"t{suffix}"))
    assert again.models == trace.models and again.step_s == trace.step_s
    for model in trace.models:
        assert np.allclose(again.series(model), trace.series(model), rtol=1e-5)
    assert again.meta["peak_valley_ratio"] == 2.0


def test_trace_arrivals_follow_the_rate():
    trace = diurnal_trace(50.0, hours=24, step_min=60, noise=0.0)
    times = trace.arrivals("model", rng=0)
    counts = np.bincount((times // 3600).astype(int), minlength=24)
    expected = trace.series("model") * 3600
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_bad_trace_inputs(tmp_path):
    with pytest.raises(WorkloadError):
        diurnal_trace(-1.0)
    with pytest.raises(WorkloadError):
        diurnal_trace(10.0, peak_valley_ratio=0.5)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(WorkloadError, match="not a diurnal trace"):
        DiurnalTrace.load(bad)


# ----------------------------------------------------------------- CLI


def test_cli_sample_prints_stats_and_saves(tmp_path, capsys):
    out = tmp_path / "sizes.npy"
    assert main(["workload", "sample", "--dist", "production", "--n", "20000", "--seed", "0", "--out", str(out),
                 "--plot", str(tmp_path / "hist.png")]) == 0
    text = capsys.readouterr().out
    for word in ("mean", "median", "p90", "p99"):
        assert word in text
    assert np.array_equal(np.load(out), size_distribution("production").sample(20000, 0))
    assert (tmp_path / "hist.png").stat().st_size > 0


def test_cli_trace_and_indices(tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert main(["workload", "trace", "--peak-qps", "1000", "--hours", "24", "--step-min", "15",
                 "--out", str(out)]) == 0
    assert DiurnalTrace.load(out).times_s.size == 96
    capsys.readouterr()
    assert main(["workload", "trace-show", str(out), "--plot", str(tmp_path / "trace.png")]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("96 steps of 15 min") and "peak/valley 2." in shown
    assert (tmp_path / "trace.png").stat().st_size > 0
    assert main(["workload", "indices", "--locality", "0.9", "--rows", "10000", "--n", "100000"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("measured locality"))
    assert abs(float(line.rsplit(" ", 1)[1]) - 0.9) <= 0.02


@pytest.mark.parametrize("argv", [
    ["workload", "sample", "--dist", "bogus"],
    ["workload", "sample", "--dist", "file:/no/such.npy"],
    ["workload", "trace", "--peak-qps", "abc"],
    ["workload", "indices", "--locality", "2"],
    ["workload", "trace-show", "/no/such/trace.json"],
    ["workload", "sample", "--n", "2e9", "#at most 100,000,000"],  # once a 15 GiB allocation's traceback
    ["workload", "trace", "--peak-qps", "a=1,a=2", "#names ['a'] more than once"],
    ["workload", "trace", "--peak-qps", "5", "--hours", "8784", "--step-min", "0.02", "#at most 1,000,000"],
    ["workload", "indices", "--hot-fraction", "2", "#in (0, 1]"],
])
def test_cli_bad_input_exits_2_with_one_line(argv, capsys):
    said = [a[1:] for a in argv if a.startswith("#")]
    assert main([a for a in argv if not a.startswith("#")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("recserve") and "error:" in err and "\n" not in err  # argparse: "recserve workload x: error:"
    assert all(s in err for s in said), err
