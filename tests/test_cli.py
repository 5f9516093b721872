"""Each planner/CLI defect of issue #17, found by trying: now exit 2 with one line naming the argument, or a
correct answer."""

from __future__ import annotations

import contextlib
import io

import pytest

from recserve.cli import main


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def traffic(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "traffic.yaml"
        path.write_text(text)
        return str(path)
    return write


COLOCATE = ["plan", "colocate", "--server", "hera-xeon", "--models", "hera-dlrm-a,hera-ncf"]
SHARD = ["plan", "shard", "--model", "hercules-rmc1"]
TIER = ["plan", "tier", "--model", "sdm-m1"]
SEARCH = ["plan", "search", "--model", "hercules-rmc1", "--server", "hera-xeon", "--no-exhaustive"]
REFUSED = [
    (COLOCATE + ["--level", "nan"], "--level"),
    (COLOCATE + ["--level", "inf"], "--level"),
    (COLOCATE + ["--level", "2", "--seeds", "0"], "--seeds"),
    (COLOCATE + ["--level", "2", "--low-share", "1.5"], "--low-share"),
    (SEARCH + ["--sla-ms", "0"], "--sla-ms"),
    (SEARCH + ["--batches", "abc"], "--batches"),
    (SEARCH + ["--batches", ","], "--batches"),
    (SEARCH + ["--percentile", "101"], "--percentile"),
    (SHARD + ["--qps", "nan"], "--qps"),
    (SHARD + ["--qps", "inf"], "--qps"),
    (SHARD + ["--qps", "100", "--batch", "0"], "--batch"),
    (SHARD + ["--qps", "100", "--locality", "1.5"], "--locality"),
    (SHARD + ["--qps", "100", "--max-shards", "0"], "--max-shards"),
    (SHARD + ["--qps", "100", "--min-mem-mb", "-1000"], "--min-mem-mb"),
    (TIER + ["--dram-gb", "64", "--qps", "200", "--queue-depth", "0"], "--queue-depth"),
    (TIER + ["--dram-gb", "64", "--qps", "nan"], "--qps"),
    (TIER + ["--dram-gb", "64", "--qps", "inf"], "--qps"),
    (TIER + ["--dram-gb", "64", "--qps", "200", "--locality-user", "1.1"], "--locality-user"),
    (TIER + ["--dram-gb", "64", "--qps", "200", "--locality-item", "-0.1"], "--locality-item"),
    (TIER + ["--dram-gb", "64", "--qps", "200", "--server", "hera-xeon"], "--server"),
    (["serve", "--model", "hercules-rmc1", "--workers", "0"], "--workers"),
]


@pytest.mark.parametrize(("argv", "names"), REFUSED, ids=[" ".join(a[2:]) for a, _ in REFUSED])
def test_bad_argument_is_exit_2_with_one_line_naming_it(argv, names):
    rc, _, err = run(argv)
    assert rc == 2 and names in error_line(err), err


# long-running commands: a bad number is refused before any work starts (a server, a simulation, a profile)
LONG_RUNNING = [
    (["bench", "--rate", "0"], "--rate"), (["bench", "--percentile", "101"], "--percentile"),
    (["bench", "--procs", "0"], "--procs"), (["bench", "--duration", "-1"], "--duration"),
    (["bench", "--growth", "1"], "--growth"), (["demo", "--live-seconds", "0"], "--live-seconds"),
    (["demo", "--window-s", "nan"], "--window-s"), (["profile", "host", "--scale", "-1"], "--scale"),
    (["profile", "interference", "--seconds", "inf"], "--seconds"),
    (["simulate", "colocate", "--seed", "-1"], "--seed"), (["simulate", "colocate", "--cores", "0"], "--cores"),
    (["simulate", "dispatch", "--rtol", "0"], "--rtol"), (["simulate", "dispatch", "--queries", "-5"], "--queries"),
    (["shards", "serve", "--model", "hercules-rmc1", "--http-port", "70000"], "--http-port"),
    (["shards", "serve", "--model", "hercules-rmc1", "--locality", "2"], "--locality"),
    (["route", "--pool", "p.json", "--port", "-1"], "--port"),
    (["workload", "trace", "--peak-hour", "24"], "--peak-hour"),
]


@pytest.mark.parametrize(("argv", "names"), LONG_RUNNING, ids=[" ".join(a) for a, _ in LONG_RUNNING])
def test_long_running_commands_refuse_bad_numbers_before_starting(argv, names):
    rc, _, err = run(argv)
    assert rc == 2 and names in error_line(err), err


@pytest.mark.parametrize(("extra", "names"), [
    (["--alpha", "nan"], "--alpha"), (["--alpha", "-0.9"], "--alpha"), (["--steps", "0"], "--steps"),
    (["--gap", "-1"], "--gap"), (["--available", "hercules-t1=-3"], "--available"),
])
def test_provision_arguments(traffic, extra, names):
    path = traffic("available: {hercules-t1: 10}\npeak_qps: {hercules-rmc1: 1000}\n")
    rc, _, err = run(["plan", "provision", "--traffic", path, *extra])
    assert rc == 2 and names in error_line(err), err


@pytest.mark.parametrize(("text", "names"), [
    ("available: {hercules-t1: 10}\npeak_qps: {hercules-rmc1: 0}\n", "every peak_qps is 0"),
    ("available: {hercules-t1: 10}\npeak_qps: {hercules-rmc1: 100}\nsteps: 0\n", "steps"),
    ("available: {hercules-t1: -2}\npeak_qps: {hercules-rmc1: 100}\n", "available.hercules-t1"),
    ("available: {hercules-t1: 10}\npeak_qps: {hercules-rmc1: .nan}\n", "peak_qps.hercules-rmc1"),
    ("available: {hercules-t1: 10}\ntrace: {hours: [0, 12], loads: {hercules-rmc1: [100]}}\n",
     "trace.hours holds 2 value(s); give one per step of trace.loads (1)"),
])
def test_provision_traffic_file_values(traffic, text, names):
    rc, _, err = run(["plan", "provision", "--traffic", traffic(text)])
    assert rc == 2 and names in error_line(err), err


def test_colocate_beyond_any_cluster_is_refused_not_a_hang(traffic):
    rc, _, err = run(["plan", "colocate", "--server", "hera-xeon", "--traffic", traffic("hera-dlrm-a: 1e12\n")])
    assert rc == 3 and "lower the target QPS" in error_line(err)
    rc, _, err = run(COLOCATE + ["--level", "1e12"])
    assert rc == 3 and "lower the target QPS" in error_line(err)


def test_shard_checks_the_sla_and_says_when_sharding_does_not_pay():
    rc, _, err = run(SHARD + ["--qps", "100", "--batch", "100000"])
    assert rc == 3 and "of the 20 ms p95 SLA" in error_line(err) and "lower the batch" in error_line(err)
    rc, _, err = run(SHARD + ["--qps", "100", "--batch", "100000", "--saturation-sizing"])
    assert rc == 3 and "over the 20 ms p95 SLA" in error_line(err)
    rc, out, _ = run(SHARD + ["--qps", "100", "--grid", "64"])
    assert rc == 0 and ("less memory" in out or "more memory (sharding does not pay" in out)


def test_tier_budget_beyond_the_tables_saves_nothing():
    rc, out, _ = run(TIER + ["--dram-gb", "1e9", "--qps", "200", "--json"])
    assert rc == 0
    import json

    plan = json.loads(out)
    assert plan["summary"]["dram_saved_gb"] == 0.0
    assert any("no SSD tier needed" in note for note in plan["notes"])


def test_search_without_a_feasible_baseline_prints_no_infinite_gain():
    rc, out, err = run(SEARCH + ["--sla-ms", "0.01"])
    assert rc == 3 and "infx" not in out and "no feasible configuration" in out  # an impossible request: exit 3
    assert "no configuration meets" in err


def test_profile_model_on_this_host_states_its_power_assumption(tmp_path):
    out_file = tmp_path / "p.json"
    rc, out, err = run(["profile", "model", "--models", "hercules-rmc1", "--servers", "this-host", "--out",
                        str(out_file)])
    assert rc == 0 and out_file.exists(), err
    from recserve.hostinfo import this_host

    assert any(a.startswith("power_w=") and "assumed" in a for a in this_host()["assumptions"])


def test_the_cli_parser_starts_without_torch():
    """Every command's parser is built at start: none may import torch (1.4 s here) until a command needs it."""
    import subprocess
    import sys

    code = "import sys; from recserve.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_the_provision_example_plans_a_day_that_fits(tmp_path):
    """The example `recserve plan provision --help` and docs/planners.md give, on the bundled perfmodel."""
    from pathlib import Path

    example = Path(__file__).parents[1] / "examples" / "day.yaml"
    rc, out, err = run(["plan", "provision", "--traffic", str(example), "--json", str(tmp_path / "prov.json")])
    assert rc == 0, err
    assert "hercules vs greedy" in out and (tmp_path / "prov.json").exists()


def test_provision_alpha_names_both_forms():
    from pathlib import Path

    example = str(Path(__file__).parents[1] / "examples" / "day.yaml")
    rc, _, err = run(["plan", "provision", "--traffic", example, "--alpha", "abc"])
    assert rc == 2 and "must be a finite number in [0, 10], got 'abc', or 'history'" in error_line(err)


def test_a_tier_plan_the_ssd_cannot_serve_exits_3_not_a_crashs_1():
    rc, out, err = run(["plan", "tier", "--model", "sdm-m1", "--dram-gb", "64", "--qps", "1e8"])
    assert rc == 3 and "feasible" in out and "the plan is infeasible" in err


@pytest.mark.parametrize("flag, server, workers", [(None, "INFO", "WARNING"), ("warning", "WARNING", "WARNING"),
                                                   ("error", "ERROR", "ERROR"), ("debug", "DEBUG", "WARNING")])
def test_serve_log_level_sets_the_servers_and_its_workers_level(monkeypatch, request, flag, server, workers):
    import logging

    from recserve.serving.node.server import NodeServer
    from recserve.serving.worker.main import LOG_LEVEL_ENV, worker_log_level

    seen: dict[str, int] = {}
    monkeypatch.setattr(NodeServer, "run_forever", lambda self: seen.update(level=logging.getLogger(
        "recserve").getEffectiveLevel(), workers=worker_log_level()))
    monkeypatch.setenv(LOG_LEVEL_ENV, "")
    logger = logging.getLogger("recserve")
    request.addfinalizer(lambda level=logger.level: logger.setLevel(level))
    argv = ["serve", "--model", "hercules-rmc1", "--http-port", "0", "--grpc-port", "0"]
    assert main(argv + (["--log-level", flag] if flag else [])) == 0
    assert seen == {"level": getattr(logging, server), "workers": getattr(logging, workers)}


def test_serve_refuses_an_unknown_log_level(capsys):
    assert main(["serve", "--model", "hercules-rmc1", "--log-level", "loud"]) == 2
    assert "--log-level" in capsys.readouterr().err
