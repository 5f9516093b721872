"""Mistakes a user makes on the command line are one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import contextlib
import io

import pytest

from recserve.cli import main


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("recserve: error: "), err
    return err.strip()


@pytest.mark.parametrize("argv", [
    ["plan", "tier", "--model", "hera-ncf", "--dram-gb", "1", "--qps", "10", "--out", "{file}/plan.json"],
    ["deploy", "k8s", "--model", "elasticrec-rm1", "--qps", "3000", "--out", "{file}/k8s.yaml"],
])
def test_an_output_path_that_cannot_be_made_names_it(tmp_path, argv):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc, err = run([a.replace("{file}", str(blocker)) for a in argv])
    assert rc == 2 and one_line(err).endswith(f"cannot be written: {blocker} is not a writable directory")


def test_an_unknown_kubernetes_version_lists_the_known_ones(tmp_path):
    rc, err = run(["deploy", "k8s", "--model", "elasticrec-rm1", "--qps", "3000", "--out", str(tmp_path / "k.yaml"),
                   "--k8s-version", "9.99"])
    assert rc == 2 and "Kubernetes version '9.99' has no API schema here; known: 1." in one_line(err)


def test_a_pool_of_an_unknown_instance_type_names_the_known_ones():
    rc, err = run(["simulate", "dispatch", "--reference", "kairos", "--model", "rm2", "--pool", "g4dn.xlarge=1,foo=2"])
    assert rc == 2 and "no latency table for model 'kairos-rm2' on 'foo'; have ['g4dn.xlarge'" in one_line(err)


def test_a_dram_need_under_a_tenth_of_a_gb_is_printed_as_it_is():
    rc, err = run(["plan", "tier", "--model", "hera-ncf", "--dram-gb", "0.01", "--qps", "10"])
    assert rc == 3 and "tables kept in DRAM need 0.0143 GB, more than the 0.01 GB budget" in one_line(err)


def test_an_unknown_dispatch_policy_lists_only_those_there_are():
    from recserve.errors import RecserveError
    from recserve.policies.dispatch import make_policy

    with pytest.raises(RecserveError) as exc:
        make_policy("oracle", 100.0)
    assert str(exc.value) == "unknown dispatch policy 'oracle'; known: clockwork, drs, fcfs, kairos, ribbon"


def test_a_pool_backend_whose_url_is_no_url_is_refused_at_start(tmp_path):
    pool = tmp_path / "pool.yaml"
    pool.write_text("qos_ms: 100\nbackends:\n  - {url: notaurl, type: t}\n")
    rc, err = run(["route", "--pool", str(pool)])
    assert rc == 2
    assert one_line(err).endswith("pool.yaml: backends[0].url: must be http[s]://host[:port][/prefix], got 'notaurl'")


def test_route_on_a_taken_port_is_one_error_line(tmp_path):
    import socket

    pool = tmp_path / "pool.yaml"
    pool.write_text("qos_ms: 100\nbackends:\n  - {url: 'http://127.0.0.1:9', type: t}\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, err = run(["route", "--pool", str(pool), "--port", str(port)])
    assert rc == 2 and f"route: cannot listen on 127.0.0.1:{port}: " in one_line(err)


def test_more_tables_than_the_model_has_is_refused():
    import subprocess
    import sys

    # a subprocess: `shards serve` installs its own signal handlers first
    done = subprocess.run([sys.executable, "-m", "recserve.cli", "shards", "serve", "--model", "elasticrec-rm1",
                           "--max-tables", "99"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert one_line(done.stderr) == "recserve: error: --max-tables 99: elasticrec-rm1 has 10 tables"


def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path):
    """`plan fleet --spec S --out S` once replaced the spec with the plan (an unwritable output: the test above)."""
    spec = tmp_path / "fleet.yaml"
    text = "models:\n  hercules-rmc1: {peak_qps: 10}\nowned: {this-host: 1}\n"
    spec.write_text(text)
    rc, err = run(["plan", "fleet", "--spec", str(spec), "--out", str(spec)])
    assert rc == 2 and one_line(err).endswith("fleet.yaml: is also the command's --spec input; write the output to "
                                              "another file") and spec.read_text() == text


def test_a_plan_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    from recserve.jsonio import write_text_atomic

    target = tmp_path / "plan.json"
    target.write_text("old")

    def fail(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr("os.replace", fail)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_shard_plan_for_another_model_is_refused_before_anything_starts(tmp_path):
    from recserve.planners.plan import ShardPlan, TableShards

    plan = ShardPlan(model="elasticrec-rm1@tables=2", target_qps=100.0, batch=32, dense_replicas=1,
                     dense_memory_bytes=1.0, tables=[TableShards("t", [0, 10], [1], [1.0], 1.0)], modelwise_replicas=1,
                     modelwise_memory_bytes=1.0)
    path = plan.save(tmp_path / "plan.json")
    rc, err = run(["shards", "serve", "--model", "elasticrec-rm2", "--max-tables", "2", "--plan", str(path),
                   "--http-port", "0", "--grpc-port", "0"])
    assert rc == 2 and one_line(err).endswith("plan.json: a shard plan for 'elasticrec-rm1@tables=2', not "
                                              "'elasticrec-rm2@tables=2' (--model elasticrec-rm2 --max-tables 2)")


def test_a_model_named_twice_is_refused_and_an_impossible_search_exits_3(tmp_path):
    rc, err = run(["plan", "colocate", "--server", "hera-xeon", "--models", "hera-ncf,hera-ncf", "--level", "1"])
    assert rc == 2 and one_line(err).endswith("--models: 'hera-ncf' given more than once in 'hera-ncf,hera-ncf'")
    rc, err = run(["plan", "search", "--model", "hercules-rmc1", "--server", "hera-xeon", "--sla-ms", "0.001",
                   "--no-exhaustive", "--json", str(tmp_path / "search.json")])
    assert rc == 3 and "no configuration meets p95 < 0.001 ms" in err
    assert (tmp_path / "search.json").exists()  # the rows that failed are kept for the reader


@pytest.mark.parametrize(("replicas", "said"), [
    ("2,1,1,1", "--replicas gives 4 counts, but the tables have at most 2 shards"),
    ("1000", "--replicas values must be between 1 and 64, got '1000'"),
])
def test_replica_counts_beyond_the_shards_or_the_host_are_refused(replicas, said):
    rc, err = run(["shards", "serve", "--model", "elasticrec-rm1", "--max-tables", "1", "--scale", "1e-4",
                   "--replicas", replicas, "--warmup", "2", "--http-port", "0", "--grpc-port", "0"])
    assert rc == 2 and said in err.splitlines()[-1] and err.splitlines()[-1].startswith("recserve: error: ")
