"""The ``recserve`` command line.

Each top-level command lives in its own module under ``recserve.commands`` exposing
``register(subparsers)``; the module sets ``func`` on its parser.  Command groups (``plan``,
``profile``, ``simulate``, ``deploy``) gather their actions from modules named ``<group>_<action>.py``
(see ``commands/_group.py``).  Modules are discovered, so adding a command never touches this file.
User errors (:class:`RecserveError`, and a file or folder that cannot be read or written) print one line and exit
with code 2; a valid request that no plan can meet (:class:`InfeasibleError`, or a plan printed and marked
infeasible) exits with code 3 (``EXIT_INFEASIBLE``); 1 is left to a crash.  SIGTERM stops a command as Ctrl-C does.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import pkgutil
import signal
import sys
import threading
from typing import Any, NoReturn

import recserve
import recserve.serving.node.repository  # noqa: F401 - repository paths become model names (specs.add_model_source)
from recserve import commands
from recserve.errors import EXIT_INFEASIBLE, InfeasibleError, RecserveError


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line naming the argument and exit code 2 (as every other user error);
    ``--help`` still shows the usage.  Sub-parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def finite_float(text: str) -> float:
    """Every ``type=float`` option's parser: NaN and infinities are never a meaningful rate, size or time."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


finite_float.__name__ = "a finite number"


def seed_value(text: str) -> int:
    """Every ``--seed``/``--*-seed`` option's parser: numpy seeds are non-negative integers."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


seed_value.__name__ = "an integer >= 0"


def _every_option(parser: argparse.ArgumentParser) -> None:
    """Rules for every option of ``parser`` and its sub-parsers: ``type=float`` is :func:`finite_float`, integer
    seeds are :func:`seed_value` (commands keep writing plain ``float`` / ``int``), and help shows the default."""
    for action in parser._actions:
        if action.type is float:
            action.type = finite_float
        if action.type is int and (action.dest == "seed" or action.dest.endswith("_seed")):
            action.type = seed_value
        _show_default(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                _every_option(sub)


def _show_default(action: argparse.Action) -> None:
    """An option's help ends with its default where it has one and does not say it already (every command's
    ``--help`` tells what an option left out does)."""
    default, text = action.default, action.help or ""
    if (not action.option_strings or default in (None, False, "", argparse.SUPPRESS) or text == argparse.SUPPRESS
            or "default" in text.lower() or isinstance(action, argparse._VersionAction)):
        return
    action.help = f"{text} (default: %(default)s)" if text else "default: %(default)s"


def version() -> str:
    """The installed distribution's version; the package's own where recserve runs uninstalled (a source tree)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("recserve")
    except PackageNotFoundError:
        return recserve.__version__


class VersionAction(argparse.Action):
    """``--version``: prints ``recserve <version>`` and exits; the version is looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print recserve's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> NoReturn:
        print(f"recserve {version()}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="recserve",
        description="Serve recommendation models on heterogeneous hardware at the lowest cost that meets their SLAs.",
    )
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if "_" in info.name:
            continue  # private helpers and group actions (<group>_<action>) are registered by their group
        module = importlib.import_module(f"recserve.commands.{info.name}")
        module.register(sub)
    _every_option(parser)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that its cleanup (servers it started, temporary files) runs as on
    Ctrl-C.  Commands that stop in their own way on SIGTERM (``serve``, ``deploy local``) install their own."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def _catch_sigterm() -> Any:
    """Install ``_raise_terminated`` where SIGTERM would otherwise end the process at once; the handler it replaced,
    to restore (None: left as it was: not the main thread, or a handler already set)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


OUTPUT_FLAGS = ("out", "json", "json_out", "plot", "save_profiles", "save_measured", "save_micro")
INPUT_FLAGS = ("spec", "plan", "config", "profiles", "pool", "measured", "calibration", "reference", "trace", "file")


def _check_outputs(args: argparse.Namespace) -> None:
    """Every file a command will write, checked before it starts: not one of its inputs, and writable."""
    from recserve.jsonio import check_output

    inputs = {f"--{flag.replace('_', '-')}": value for flag in INPUT_FLAGS
              if isinstance(value := getattr(args, flag, None), str) and value}
    for flag in OUTPUT_FLAGS:
        value = getattr(args, flag, None)
        if isinstance(value, str) and value:
            check_output(value, inputs, flag=f"--{flag.replace('_', '-')}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad argument (2) or --help (0): a return code, so main() is callable in-process
        return exc.code if isinstance(exc.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    previous = _catch_sigterm()
    try:
        _check_outputs(args)
        return int(args.func(args) or 0)
    except InfeasibleError as exc:
        print(f"recserve: error: {exc}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except RecserveError as exc:
        print(f"recserve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        stopped = isinstance(exc, Terminated)
        print(("\n" if sys.stderr.isatty() else "") + f"recserve: {'stopped (SIGTERM)' if stopped else 'interrupted'}",
              file=sys.stderr)  # on a terminal, not glued to a progress line
        return 143 if stopped else 130
    except BrokenPipeError:  # e.g. `recserve models show X | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file or folder the user named cannot be read or written: one line, as a user error
        if exc.filename is None:
            raise
        print(f"recserve: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
