"""Schemas of what users hand to recserve (node and repository configs, control-API bodies, plan files).

Each is a pydantic model that refuses unknown keys (``extra="forbid"``: a typo such as ``wokers`` is an error, not
a silent default) and checks types strictly (``true`` is not a worker count, ``"5"`` is not a timeout).  Their
errors become one line, ``where: field.path[0]: message``, raised as the caller's own exception type
(:func:`error_line`), so a user sees the same style whichever file or request was wrong.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from contextvars import ContextVar
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError

from recserve.errors import SpecError

BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
KINDS = {"int_type": "an integer", "int_from_float": "an integer", "int_parsing": "an integer",
         "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
         "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
         "list_type": "a list", "tuple_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
         "model_attributes_type": "a mapping", "dataclass_type": "a mapping", "none_required": "null"}


def integer(ge: int | None = None, le: int | None = None) -> Any:
    """A strict integer (``true`` and ``1.0`` refused) within the bounds."""
    return Annotated[StrictInt, Field(ge=ge, le=le)]


def number(gt: float | None = None, ge: float | None = None, lt: float | None = None, le: float | None = None) -> Any:
    """A strict finite number (an integer counts; ``true``, ``"5"``, NaN and infinities do not) within the bounds."""
    return Annotated[StrictFloat, Field(gt=gt, ge=ge, lt=lt, le=le, allow_inf_nan=False)]


def field_path(loc: tuple[Any, ...]) -> str:
    """``("models", 0, "workers")`` -> ``models[0].workers``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _schema_at(schema: Any, loc: tuple[Any, ...]) -> Any:
    """The model or dataclass that validated the mapping at ``loc`` under ``schema`` (None if not found)."""
    for part in loc:
        if isinstance(part, int) or schema is None:
            continue
        fields = _fields(schema)
        schema = _inner_schema(fields[part]) if part in fields else None
    return schema


def _fields(schema: Any) -> dict[str, Any]:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return {name: f.annotation for name, f in schema.model_fields.items()}
    if dataclasses.is_dataclass(schema):
        hints = typing.get_type_hints(schema)
        return {f.name: hints.get(f.name) for f in dataclasses.fields(schema)}
    return {}


def _inner_schema(annotation: Any) -> Any:
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_schema(arg)
        if found is not None:
            return found
    return None


def allowed_keys(schema: Any) -> list[str]:
    """The keys a mapping validated by ``schema`` takes (a model's aliases included)."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        keys = set(schema.model_fields)
        for f in schema.model_fields.values():
            keys |= {a for a in getattr(f.validation_alias, "choices", []) if isinstance(a, str)}
        return sorted(keys)
    return sorted(_fields(schema))


def describe(error: dict[str, Any], schema: Any = None) -> str:
    """One pydantic error as the message part of the line: ``must be >= 1, got 0``, ``unknown field; ...``."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):  # the latter: a dataclass's
        allowed, key = allowed_keys(_schema_at(schema, error["loc"][:-1])), str(error["loc"][-1])
        close = difflib.get_close_matches(key, allowed, n=1) or [a for a in allowed if a.startswith(key)][:1]
        return "unknown field" + (f" (did you mean {close[0]!r}?)" if close else "") + (
            f"; allowed: {allowed}" if allowed else "")
    if kind in ("missing", "missing_argument"):
        return "required"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    if kind in BOUNDS:
        bound = next(iter(ctx.values()))
        wanted = f"{BOUNDS[kind]} {int(bound) if float(bound).is_integer() else bound}"
    elif kind in KINDS:
        wanted = KINDS[kind]
    elif kind == "too_short":
        wanted = "non-empty" if ctx.get("min_length") == 1 else f"at least {ctx.get('min_length')} long"
    elif error["msg"].startswith("Input should be "):
        wanted = error["msg"].removeprefix("Input should be ")
    else:
        return f"{error['msg']}, got {_short(error['input'])}"
    return f"must be {wanted}, got {_short(error['input'])}"


def error_line(exc: ValidationError, where: str = "", schema: Any = None) -> str:
    """The first error of ``exc`` as one line ``where: field.path: message`` (parts that are empty left out)."""
    error = exc.errors(include_url=False)[0]
    return ": ".join(p for p in (where, field_path(error["loc"]), describe(error, schema)) if p)


_VALIDATING: ContextVar[bool] = ContextVar("recserve_schema_validating", default=False)
"""Set while a model is validated: a nested model's ``__init__`` (pydantic calls it) lets errors reach the outer one,
which reports the whole field path."""


class Schema(BaseModel):
    """Base of the config models: unknown keys refused; a bad value raises ``error`` (SpecError) as one line
    whether the model is built from a file (:meth:`parse`) or in code (``NodeConfig(models=...)``)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use: the CLI starts faster
    error: ClassVar[type[Exception]] = SpecError

    def __init__(self, /, **data: Any) -> None:
        if _VALIDATING.get():
            super().__init__(**data)
            return
        token = _VALIDATING.set(True)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise self.error(error_line(exc, self.where_of(data), type(self))) from None
        finally:
            _VALIDATING.reset(token)

    @classmethod
    def where_of(cls, data: dict[str, Any]) -> str:
        """What an error of a model built in code is prefixed with."""
        return cls.__name__

    @classmethod
    def parse(cls, data: Any, where: str) -> Any:
        """``data`` (a mapping from a file or a request) validated, or ``error`` naming ``where`` and the field."""
        token = _VALIDATING.set(True)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise cls.error(error_line(exc, where, cls)) from None
        finally:
            _VALIDATING.reset(token)
