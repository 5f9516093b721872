"""The model side of a worker's query path: decode → validate → (fused) model → encode, with the shared codec."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from recserve.serving.wire import codec
from recserve.serving.wire.errors import STATUS, InferError
from recserve.wire import INPUT_DENSE, INPUT_LENGTHS, INPUT_VALUES


def as_infer_error(exc: Exception) -> InferError:
    """A failure while answering a query, as the error the client is told about.  An exception from below the
    serving layer may carry an error ``code`` of its own (a corrupt SSD table block is ``data_loss``).

    ``exc`` is let go of its traceback and of the exceptions it was raised from: the answer needs none of them, and
    a caught exception kept in a local of the frame that caught it is a cycle through that traceback's frames, which
    holds their data (a refused request's buffer) until the cyclic GC next runs."""
    error = exc if isinstance(exc, InferError) else None
    if error is None:
        code = getattr(exc, "code", None)
        known = isinstance(code, str) and code in STATUS
        error = InferError(code, str(exc), getattr(exc, "field", None)) if known else \
            InferError("internal", f"{type(exc).__name__}: {exc}")
    exc.__traceback__ = exc.__cause__ = exc.__context__ = None
    return error


class ModelPath(Protocol):
    """The model side of a worker's query path (``make_model_path``)."""

    def decode(self, body: bytearray | memoryview, header_length: str | None) -> tuple[dict, tuple, int]: ...
    def validate(self, arrays: dict[str, np.ndarray], plan: Any = None) -> tuple[tuple, int]: ...
    def owed(self, arrays: dict[str, np.ndarray], plan: Any) -> tuple[tuple, int] | None: ...
    def check_owed(self, query: tuple) -> None: ...
    def compute(self, queries: list[tuple]) -> list[np.ndarray]: ...
    def encode(self, request: dict, scores: np.ndarray) -> tuple[bytes, dict[str, str]]: ...


def make_model_path(model: Any, model_name: str, info: Any, max_batch_size: int,
                    run: Callable[[tuple], np.ndarray], max_json: int, version: str = "1",
                    regions: Any = None) -> ModelPath:
    """The worker's whole-query path: decode → validate → (fused) model → encode, with the shared codec
    (``regions``: the node's shared-memory regions, for tensors that name one)."""
    from recserve.serving.wire import protocol
    from recserve.zoo.batch import BatchError, check_query, check_shapes, check_values, concat_arrays

    def wire_array(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
        """One input as the model reads it: contiguous (a JSON-decoded or sliced array may not be)."""
        if name not in arrays:
            raise BatchError(name, "input tensor missing")
        return np.ascontiguousarray(arrays[name])

    plans = codec.HttpPlans()
    shaped: set[codec.RawPlan] = set()  # plans whose dtypes and shapes this model accepted (HTTP's and gRPC's)

    class Path:
        def decode(self, body: bytearray | memoryview, header_length: str | None) -> tuple[dict, tuple, int]:
            req, arrays, plan = plans.parse_planned(body, header_length, max_json, regions)  # outputs checked too
            return (req, *self.validate(arrays, plan))

        def validate(self, arrays: dict[str, np.ndarray], plan: codec.RawPlan | None = None) -> tuple[tuple, int]:
            """``arrays`` as the codec decoded them (HTTP or gRPC): its ``check_inputs`` checked the lengths' values
            and sum, which ``check_query`` does not repeat.  Arrays read by a ``plan`` whose dtypes and shapes passed
            before are views of the request (contiguous) and have only their values checked: ~7 µs of a batch-1
            query (issue #14)."""
            try:
                if plan is not None and plan in shaped:
                    query = (arrays[INPUT_DENSE], arrays[INPUT_VALUES], arrays[INPUT_LENGTHS])
                    check_values(query[1], query[2], info.rows, info.seq_lens, lengths_checked=True)
                    return query, query[0].shape[0]
                query = (wire_array(arrays, INPUT_DENSE), wire_array(arrays, INPUT_VALUES),
                         wire_array(arrays, INPUT_LENGTHS))
                check_query(*query, info.dense_in, info.rows, info.seq_lens, max_batch_size, lengths_checked=True)
            except BatchError as exc:
                raise InferError("invalid", str(exc), exc.field) from exc
            if plan is not None:
                if len(shaped) >= 4 * codec.PLANS:  # plans come and go (``PlanStore``): keep the set bounded too
                    shaped.clear()
                shaped.add(plan)
            return query, query[0].shape[0]

        def owed(self, arrays: dict[str, np.ndarray], plan: codec.RawPlan) -> tuple[tuple, int] | None:
            """The query and its items of arrays read by a ``plan`` whose dtypes and shapes passed before (read by
            ``codec.parse_raw(..., checked=False)``), with every check of its values still owed: whichever worker
            computes it runs ``check_owed``, so a worker fronting a gRPC channel does not check the queries its
            siblings compute.  None for any other plan: ``validate`` it."""
            if plan not in shaped:
                return None
            return (arrays[INPUT_DENSE], arrays[INPUT_VALUES], arrays[INPUT_LENGTHS]), arrays[INPUT_DENSE].shape[0]

        def check_owed(self, query: tuple) -> None:
            """Every check of a query's values (``codec.check_inputs``, then ids within their tables), with its
            dtypes and shapes checked again first: a query a sibling forwarded, or one ``owed`` left unchecked."""
            dense, values, lengths = query
            try:
                check_shapes(dense, values, lengths, info.dense_in, len(info.rows), max_batch_size)
                codec.check_inputs({INPUT_DENSE: dense, INPUT_VALUES: values, INPUT_LENGTHS: lengths})
                check_values(values, lengths, info.rows, info.seq_lens, lengths_checked=True)
            except BatchError as exc:
                raise InferError("invalid", str(exc), exc.field) from exc

        def compute(self, queries: list[tuple]) -> list[np.ndarray]:
            if len(queries) == 1:
                return [run(queries[0])]
            scores = run(concat_arrays(queries))
            bounds = np.cumsum([q[0].shape[0] for q in queries])[:-1]
            return np.split(scores, bounds)

        def encode(self, request: dict, scores: np.ndarray) -> tuple[bytes, dict[str, str]]:
            return protocol.http_infer_response(model_name, request, scores, version, regions)

    return Path()
