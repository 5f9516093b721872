"""The command line's own face: every --help, a help string for every option, --version, a plan handed to a
command that reads another kind of file, and serve's HTTP and gRPC given one port."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import re
from importlib.metadata import version

import pytest

from recserve.cli import build_parser, main


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(command path, parser)`` for the top-level parser and every sub-parser below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


COMMANDS = [path for path, _ in parsers(build_parser())]


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "recserve")
def test_every_help_exits_0(path):
    rc, out, err = run([*path, "--help"])
    assert rc == 0, err
    assert out.startswith("usage: recserve")


def test_every_option_has_help():
    missing = set()
    for path, parser in parsers(build_parser()):
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction) and not action.help:
                missing.add((" ".join(path), action.option_strings[0] if action.option_strings else action.dest))
    assert not missing, sorted(missing)


@pytest.mark.parametrize("command", ["demo", "doctor", "route", "serve"])
def test_long_running_commands_describe_themselves(command):
    parser = dict(parsers(build_parser()))[(command,)]
    assert parser.description


def test_help_shows_defaults_and_accepted_names():
    assert "(default 8000)" in run(["route", "--help"])[1]
    assert "out/report.html" in run(["report", "--help"])[1]
    assert "REPO/<model>" in run(["plan", "tier", "--help"])[1]


def test_profile_host_example_keeps_its_line_break():
    """The docstring's example continues a shell line with a backslash; the help prints it as written."""
    out = run(["profile", "host", "--help"])[1]
    assert not [line for line in out.splitlines() if "--servers" in line and "--price" in line]
    assert re.search(r"--servers this-host,this-host-cuda \\\n\s+--price", out)


def test_version():
    rc, out, _ = run(["--version"])
    assert rc == 0
    assert out.strip() == f"recserve {version('recserve')}"


# ----------------------------------------------------------------- a plan given to the wrong command


@pytest.fixture
def fleet_plan(tmp_path):
    """The smallest fleet plan ``Plan.load`` accepts: what `recserve plan fleet --out` writes, less its decision."""
    import recserve.planners.fleet  # noqa: F401 - registers the fleet kind
    from recserve.planners.plan import Plan

    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"version": 1, "kind": "fleet", "planner": "fleet"}))
    assert Plan.load(path).kind == "fleet"
    return str(path)


HINT = "is a fleet plan (kind 'fleet'), not {what}; give it to `recserve deploy local|k8s|ray --plan` or " \
       "`recserve verify --plan`"


@pytest.mark.parametrize(("argv", "what"), [
    (["serve", "--config"], "a node config"),
    (["route", "--pool"], "a pool file"),
    (["plan", "fleet", "--spec"], "a fleet spec"),
])
def test_plan_given_to_a_reader_of_another_file(fleet_plan, argv, what):
    rc, _, err = run([*argv, fleet_plan])
    assert rc == 2
    assert err.strip() == f"recserve: error: {fleet_plan} " + HINT.format(what=what)


def test_every_plan_kind_has_its_commands():
    """jsonio's table of plan kinds (it may not import the planners) against the planners' registry."""
    from recserve.jsonio import PLAN_COMMANDS
    from recserve.planners.plan import _PLAN_KINDS, PLAN_MODULES, Plan

    for module in PLAN_MODULES:
        importlib.import_module(module)
    assert set(PLAN_COMMANDS) == {kind for kind, cls in _PLAN_KINDS.items() if cls is not Plan}


def test_a_kind_that_is_no_plan_kind_is_left_to_the_reader(tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text("kind: something\n")
    rc, _, err = run(["route", "--pool", str(path)])
    assert rc == 2
    assert "pool.yaml: qos_ms: required" in err  # read as a pool file, whose error it is


# ----------------------------------------------------------------- serve's ports


@pytest.fixture
def started(monkeypatch):
    """The node configs serve would start, without starting them."""
    configs = []

    class NoServer:
        def __init__(self, config):
            configs.append(config)

        def run_forever(self):
            pass

    monkeypatch.setattr("recserve.serving.NodeServer", NoServer)
    return configs


SERVE = ["serve", "--model", "hera-dlrm-a"]


def test_serve_refuses_one_port_for_http_and_grpc(started):
    rc, _, err = run([*SERVE, "--http-port", "18123", "--grpc-port", "18123"])
    assert rc == 2
    assert "--http-port and --grpc-port are the same port (18123)" in err
    assert not started


def test_serve_refuses_http_on_the_default_grpc_port(started):
    rc, _, err = run([*SERVE, "--http-port", "8001"])
    assert rc == 2
    assert "--http-port and --grpc-port (default) are the same port (8001)" in err
    assert not started


def test_serve_refuses_one_port_in_a_node_config(tmp_path, started):
    config = tmp_path / "node.yaml"
    config.write_text("http_port: 9000\ngrpc_port: 9000\nmodels:\n  - model: hera-dlrm-a\n")
    rc, _, err = run(["serve", "--config", str(config)])
    assert rc == 2
    assert "are the same port (9000)" in err
    assert not started
    assert run(["serve", "--config", str(config), "--grpc-port", "9001"])[0] == 0


def test_serve_allows_any_free_port_for_both(started):
    assert run([*SERVE, "--http-port", "0", "--grpc-port", "0"])[0] == 0
    assert [(c.http_port, c.grpc_port) for c in started] == [(0, 0)]


def test_every_option_with_a_default_says_it_in_its_help():
    import argparse

    from recserve.cli import build_parser

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in set(action.choices.values()):
                    yield from parsers(sub)

    silent = [f"{p.prog} {a.option_strings[0]}" for p in parsers(build_parser()) for a in p._actions
              if a.option_strings and a.default not in (None, False, "", argparse.SUPPRESS)
              and "default" not in (a.help or "").lower()]
    assert silent == []
