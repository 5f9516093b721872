"""Shared plumbing of ``recserve plan colocate|provision|pool``: profiles, traffic files, output."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictFloat, StrictInt

from recserve.errors import ProfileError, RecserveError, SpecError
from recserve.measure.plot import pyplot
from recserve.planners.plan import Plan
from recserve.profiles import ProfileSet
from recserve.schema import Schema
from recserve.specs import ModelSpec, ServerType, get_model, get_server, read_yaml

# ---------------------------------------------------------------- argument and file-value validators
# One set of bounds checks for every command's numbers: argparse types (``type=number(...)``) turn a bad
# value into exit 2 with "argument --x: must be ..."; files are read by schemas (``TrafficFile`` below).


def _bounds_text(low: float | None, high: float | None, low_open: bool, high_open: bool, integer: bool) -> str:
    kind = "an integer" if integer else "a finite number"
    if low is not None and high is not None:
        return f"{kind} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {high:g}"
    return kind


def _complaint(value: Any, low: float | None, high: float | None, low_open: bool, high_open: bool,
               integer: bool) -> str | None:
    """None if ``value`` is a number within the bounds, else what it must be."""
    wanted = _bounds_text(low, high, low_open, high_open, integer)
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        return wanted
    if not math.isfinite(value):
        return wanted
    if low is not None and (value < low or (low_open and value == low)):
        return wanted
    if high is not None and (value > high or (high_open and value == high)):
        return wanted
    return None


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, integer: bool = False) -> Callable[[str], Any]:
    """An argparse ``type``: a finite float (or int) within the bounds, else a one-line error naming the flag."""

    def parse(text: str) -> float | int:
        try:
            value: float | int = int(text) if integer else float(text)
        except ValueError:
            value = math.nan  # reported below with the bounds
        problem = _complaint(value, low, high, low_open, high_open, integer)
        if problem:
            raise argparse.ArgumentTypeError(f"must be {problem}, got {text!r}")
        return value

    parse.__name__ = _bounds_text(low, high, low_open, high_open, integer)
    return parse


positive = number(0, low_open=True)
non_negative = number(0)
fraction = number(0, 1)
count = number(1, integer=True)
qps = number(0, 1e9, low_open=True)
"""The common cases: sizes (> 0), memory/time offsets (>= 0), shares and locality ([0, 1]), counts (>= 1), and
query rates (a billion QPS is beyond any cluster a plan here describes; larger values only overflow counts)."""
non_negative_int = number(0, integer=True)
seed = number(0, integer=True)
port = number(0, 65535, integer=True)
percentile = number(50, 100, high_open=True)
open_fraction = number(0, 1, low_open=True, high_open=True)
growth = number(1, 1e6, low_open=True)
hour = number(0, 24, high_open=True)
"""Seeds (numpy's range), TCP ports (0 = any free one), tail percentiles (an SLA's: [50, 100)), tolerances,
multipliers, hours of a day."""
simulated_queries = number(1, 1_000_000, integer=True)
repeats = number(1, 10_000, integer=True)
"""Queries per simulated probe (a hundred times the defaults) and runs averaged: work that grows with them, bounded."""


def number_list(low: float | None = None, high: float | None = None, *, low_open: bool = False,
                high_open: bool = False, length: int | None = None) -> Callable[[str], list[float]]:
    """An argparse ``type`` for ``0.1,1.0``: comma-separated finite numbers within the bounds, exactly ``length`` of
    them if given ('' = none where no length is asked); else a one-line error naming the flag."""
    wanted = _bounds_text(low, high, low_open, high_open, False).replace("a finite number", "finite numbers")
    wanted = f"{length} comma-separated {wanted}" if length else f"comma-separated {wanted}"

    def parse(text: str) -> list[float]:
        try:
            values = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = [math.nan]  # reported below with the bounds
        if (length is not None and len(values) != length) or any(
                _complaint(v, low, high, low_open, high_open, False) for v in values):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return values

    parse.__name__ = wanted
    return parse


def int_list(text: str) -> list[int]:
    """An argparse ``type`` for ``8,16,32``: positive integers, at least one."""
    items = names(text)
    try:
        values = [int(x) for x in items]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}")
    return values


int_list.__name__ = "comma-separated integers >= 1"


def core_list(text: str) -> list[int]:
    """An argparse ``type`` for cores this process may use: ``0,1``, ranges ``0-3``, or both."""
    cores: list[int] = []
    try:
        for part in names(text):
            low, _, high = part.partition("-")
            cores += range(int(low), int(high or low) + 1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected core numbers like 0,1 or 0-3, got {text!r}") from exc
    usable = os.sched_getaffinity(0)
    if not cores or any(c not in usable for c in cores):
        raise argparse.ArgumentTypeError(f"cores {text!r} are not all usable here ({sorted(usable)})")
    return cores


def check_half_memory(mb: float, what: str) -> None:
    """A measurement's own buffers of ``mb`` MiB are refused past half this host's memory (the rest stays for the
    models it measures, the OS and the host's other work); ``what`` names the request in the one-line error."""
    from recserve.hostinfo import this_host

    most = this_host()["mem_gb"] * 1024 / 2
    if mb > most:
        raise RecserveError(f"{what} is more than half this host's memory ({most:,.0f} MiB)")


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def names(text: str | None, what: str = "") -> list[str]:
    """``a,b`` -> ["a", "b"]; an item given twice is refused (``--models a,a`` once planned one model twice)."""
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    keys = [x.partition("=")[0].strip() for x in items]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise RecserveError(f"{f'--{what}: ' if what else ''}{', '.join(repr(k) for k in twice)} given more than once "
                            f"in {text!r}")
    return items


def counts(text: str | None, what: str) -> dict[str, int]:
    """``a=3,b=5`` -> {"a": 3, "b": 5}."""
    out: dict[str, int] = {}
    for item in names(text, what):
        name, sep, value = item.partition("=")
        if not sep:
            raise RecserveError(f"--{what}: expected NAME=COUNT, got {item!r}")
        try:
            out[name.strip()] = int(value)
        except ValueError as exc:
            raise RecserveError(f"--{what}: count for {name!r} must be an integer, got {value!r}") from exc
        if out[name.strip()] < 0:
            raise RecserveError(f"--{what}: count for {name!r} must be >= 0, got {value!r}")
    return out


def prices(text: str | None, what: str = "price") -> dict[str, float]:
    """``a=1.5,b=0.2`` -> {"a": 1.5, "b": 0.2} ($/hr, > 0)."""
    out: dict[str, float] = {}
    for item in names(text, what):
        name, sep, value = item.partition("=")
        try:
            price = float(value) if sep else float("nan")
        except ValueError:
            price = float("nan")
        if not math.isfinite(price) or price <= 0:
            raise RecserveError(f"--{what}: expected NAME=USD_PER_HR with a price > 0, got {item!r}")
        out[name.strip()] = price
    return out


def _yaml_number(value: Any) -> Any:
    """A numeric string as its number: YAML 1.1 reads ``1e5`` (no dot) as a string."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    return value


def _yaml_integer(value: Any) -> Any:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    return value


def file_number(**bounds: float) -> Any:
    """A finite number from a file within ``bounds`` (``ge``, ``le``...); numeric strings count."""
    return Annotated[StrictFloat, BeforeValidator(_yaml_number), Field(allow_inf_nan=False, **bounds)]


def file_integer(**bounds: int) -> Any:
    return Annotated[StrictInt, BeforeValidator(_yaml_integer), Field(**bounds)]


class Trace(Schema):
    """``trace:``: each model's QPS per step, and optionally the hour of each step (default: spread over 24 h)."""

    hours: list[file_number()] | None = None
    loads: dict[str, list[file_number(ge=0)]] = Field(min_length=1)


class TrafficFile(Schema):
    """A traffic file (YAML or JSON): ``plan colocate``'s targets ``models: {model: qps}`` (a file of only
    ``model: qps`` lines is read as ``models``), ``plan provision``'s day: ``available: {type: count}`` and
    ``peak_qps: {model: qps}`` (a diurnal trace of ``steps`` steps, valleys at ``trough_ratio``) or ``trace``."""

    models: dict[str, file_number(ge=0)] | None = None
    available: dict[str, file_integer(ge=0)] | None = None
    peak_qps: dict[str, file_number(ge=0)] | None = None
    trace: Trace | None = None
    steps: file_integer(ge=1) = 48
    trough_ratio: file_number(ge=0, le=1) = 0.5


def read_traffic(path: str | Path) -> TrafficFile:
    """A YAML or JSON traffic file (both parse as YAML), checked."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a traffic file is a mapping (model: qps, or models/peak_qps/trace/available)")
    if not set(data) & set(TrafficFile.model_fields):
        data = {"models": data}
    return TrafficFile.parse(data, str(path))


def static_targets(traffic: TrafficFile, where: str) -> dict[str, float]:
    """``{model: qps}`` of a traffic file's ``models``."""
    if traffic.models is None:
        raise SpecError(f"{where}: give the targets as 'models: {{model: qps}}' (or only 'model: qps' lines)")
    return dict(traffic.models)


def resolve_specs(models: list[str], servers: list[str]) -> tuple[list[ModelSpec], list[ServerType]]:
    return [get_model(m) for m in models], [get_server(s) for s in servers]


def check_this_host(profiles: ProfileSet, servers: list[str], where: str) -> ProfileSet:
    """``this-host`` tables measured on a host with another core count describe that host, not this one (whose
    cores and memory ``this-host`` names at run time): refused where a command plans for ``this-host``."""
    from recserve.hostinfo import this_host

    measured = profiles.meta.get("host")
    if "this-host" not in servers or not isinstance(measured, dict) or "cores" not in measured:
        return profiles
    cores = this_host()["cores"]
    if measured["cores"] != cores:
        raise ProfileError(f"{where}: its this-host tables were measured on a {measured['cores']}-core host, this one "
                           f"has {cores} cores; measure here with `recserve profile host`")
    return profiles


def profiles_for(args: argparse.Namespace, models: list[str], servers: list[str], **model_kw: Any) -> ProfileSet:
    """``--profiles FILE`` if given, else the analytic perfmodel for exactly these models and servers."""
    if getattr(args, "profiles", None):
        return check_this_host(ProfileSet.load(args.profiles), servers, args.profiles)
    specs, types = resolve_specs(models, servers)
    try:
        from recserve.perfmodel import model_profiles
    except ImportError as exc:
        raise RecserveError("no --profiles FILE given and the analytic perfmodel (recserve.perfmodel.model_profiles) "
                            f"is not available: {exc}") from exc
    progress(f"modelling {len(specs)} model(s) on {len(types)} server type(s) with the perfmodel "
             "(give --profiles FILE to use measured tables)")
    from recserve.planners.hercules.search import efficiency_tables

    extra = efficiency_tables if model_kw.pop("efficiency", True) else None
    profiles = model_profiles(specs, types, progress=progress, extra=extra, **model_kw)
    if getattr(args, "save_profiles", None):
        profiles.save(args.save_profiles)
        progress(f"wrote {args.save_profiles}")
    return profiles


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profiles", metavar="FILE", help="Profile tables (JSON); default: the analytic perfmodel")
    p.add_argument("--save-profiles", metavar="FILE", help="write the modelled profiles used")
    p.add_argument("--json", metavar="FILE", help="write the Plan as JSON")
    p.add_argument("--plot", metavar="PNG", help="write a figure")


def emit(plan: Plan, args: argparse.Namespace) -> None:
    print(plan.table())
    if plan.notes:
        print("\n" + "\n".join(f"note: {n}" for n in plan.notes))
    if getattr(args, "json", None):
        plan.save(args.json)
        progress(f"wrote {args.json}")


def figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (8, 4)):
    plt = pyplot()
    return plt, *plt.subplots(nrows, ncols, figsize=size)


def save_figure(plt: Any, fig: Any, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    progress(f"wrote {path}")


def dump(data: Any) -> str:
    return json.dumps(data, indent=1)
