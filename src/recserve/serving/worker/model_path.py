"""The model side of a worker's query path: decode → validate → (fused) model → encode, with the shared codec."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from recserve.serving.wire import codec
from recserve.serving.wire.errors import STATUS, InferError
from recserve.wire import INPUT_DENSE, INPUT_LENGTHS, INPUT_VALUES, OUTPUT_SCORES


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


def checked_scores(scores: Any, items: int, towers: int, model_name: str) -> np.ndarray:
    """A model's scores for ``items`` samples, checked on every pass as the load checked them once (``[items,
    towers]``, finite FP32; FP16, a model converted to half precision on a device, widened exactly): a model whose
    output depends on its input can break the contract on some queries only."""
    want = (items, towers)
    if not isinstance(scores, np.ndarray) or scores.shape != want:
        got = list(scores.shape) if isinstance(scores, np.ndarray) else type(scores).__name__
        raise InferError("internal", f"model {model_name!r} returned scores {got} for {items} item(s), expected "
                                     f"{list(want)}", OUTPUT_SCORES)
    if scores.dtype != np.float32:
        if scores.dtype != np.float16:
            raise InferError("internal", f"model {model_name!r} returned {scores.dtype} scores, expected FP32",
                             OUTPUT_SCORES)
        scores = scores.astype(np.float32)
    return codec.finite_scores(scores)


class ModelPath:
    """The worker's whole-query path: decode → validate → (fused) model → encode, with the shared codec.

    ``run`` computes one query's arrays; ``info`` says what the model takes (``dense_in``, ``rows``, ``seq_lens``);
    ``regions``: the node's shared-memory regions, for tensors that name one."""

    def __init__(self, model_name: str, info: Any, max_batch_size: int, run: Callable[[tuple], np.ndarray],
                 max_json: int, version: str = "1", regions: Any = None) -> None:
        from recserve.zoo import batch  # torch: imported by a worker that computes, not by whoever imports this

        self._batch = batch
        self.model_name, self.info, self.max_batch_size = model_name, info, max_batch_size
        self.run, self.max_json, self.version, self.regions = run, max_json, version, regions
        self._plans = codec.HttpPlans()
        self._shaped: set[codec.RawPlan] = set()  # plans whose dtypes and shapes this model accepted (HTTP, gRPC)

    def decode(self, body: bytearray | memoryview, header_length: str | None) -> tuple[dict, tuple, int]:
        req, arrays, plan = self._plans.parse_planned(body, header_length, self.max_json, self.regions)  # outputs too
        return (req, *self.validate(arrays, plan))

    def validate(self, arrays: dict[str, np.ndarray], plan: codec.RawPlan | None = None) -> tuple[tuple, int]:
        """``arrays`` as the codec decoded them (HTTP or gRPC): its ``check_inputs`` checked the lengths' values
        and sum, which ``check_query`` does not repeat.  Arrays read by a ``plan`` whose dtypes and shapes passed
        before are views of the request (contiguous) and have only their values checked: ~7 µs of a batch-1
        query (issue #14)."""
        batch, info = self._batch, self.info
        try:
            if plan is not None and plan in self._shaped:
                query = (arrays[INPUT_DENSE], arrays[INPUT_VALUES], arrays[INPUT_LENGTHS])
                batch.check_values(query[1], query[2], info.rows, info.seq_lens, lengths_checked=True)
                return query, query[0].shape[0]
            query = (self._wire_array(arrays, INPUT_DENSE), self._wire_array(arrays, INPUT_VALUES),
                     self._wire_array(arrays, INPUT_LENGTHS))
            batch.check_query(*query, info.dense_in, info.rows, info.seq_lens, self.max_batch_size,
                              lengths_checked=True)
        except batch.BatchError as exc:
            raise InferError("invalid", str(exc), exc.field) from exc
        if plan is not None:
            if len(self._shaped) >= 4 * codec.PLANS:  # plans come and go (``PlanStore``): keep the set bounded too
                self._shaped.clear()
            self._shaped.add(plan)
        return query, query[0].shape[0]

    def _wire_array(self, arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
        """One input as the model reads it: contiguous (a JSON-decoded or sliced array may not be)."""
        if name not in arrays:
            raise self._batch.BatchError(name, "input tensor missing")
        return np.ascontiguousarray(arrays[name])

    def owed(self, arrays: dict[str, np.ndarray], plan: codec.RawPlan) -> tuple[tuple, int] | None:
        """The query and its items of arrays read by a ``plan`` whose dtypes and shapes passed before (read by
        ``codec.parse_raw(..., checked=False)``), with every check of its values still owed: whichever worker
        computes it runs ``check_owed``, so a worker fronting a gRPC channel does not check the queries its
        siblings compute.  None for any other plan: ``validate`` it."""
        if plan not in self._shaped:
            return None
        return (arrays[INPUT_DENSE], arrays[INPUT_VALUES], arrays[INPUT_LENGTHS]), arrays[INPUT_DENSE].shape[0]

    def check_owed(self, query: tuple) -> None:
        """Every check of a query's values (``codec.check_inputs``, then ids within their tables), with its
        dtypes and shapes checked again first: a query a sibling forwarded, or one ``owed`` left unchecked."""
        batch, info = self._batch, self.info
        dense, values, lengths = query
        try:
            batch.check_shapes(dense, values, lengths, info.dense_in, len(info.rows), self.max_batch_size)
            codec.check_inputs({INPUT_DENSE: dense, INPUT_VALUES: values, INPUT_LENGTHS: lengths})
            batch.check_values(values, lengths, info.rows, info.seq_lens, lengths_checked=True)
        except batch.BatchError as exc:
            raise InferError("invalid", str(exc), exc.field) from exc

    def compute(self, queries: list[tuple]) -> list[np.ndarray | InferError]:
        """Each query's scores, from one pass over them all (fused) when there are several.  A fused pass that
        fails (the model raised, or its scores are not ``[items, towers]`` finite FP32) is run again query by query:
        only the queries that fail alone are answered an error (an ``InferError`` in their place), and no query is
        given scores cut from a wrongly shaped result.  A lone query's failure is raised."""
        if len(queries) == 1:
            return [self._scores(self.run(queries[0]), queries[0][0].shape[0])]
        items = [q[0].shape[0] for q in queries]
        try:
            scores = self._scores(self.run(self._batch.concat_arrays(queries)), sum(items))
        except Exception:  # noqa: BLE001 - which query failed it is found by running each alone
            return [self._alone(q, n) for q, n in zip(queries, items, strict=True)]
        return np.split(scores, np.cumsum(items)[:-1])

    def _alone(self, query: tuple, items: int) -> np.ndarray | InferError:
        try:
            return self._scores(self.run(query), items)
        except Exception as exc:  # noqa: BLE001 - this query's answer is its error
            return as_infer_error(exc)

    def _scores(self, scores: Any, items: int) -> np.ndarray:
        return checked_scores(scores, items, self.info.towers, self.model_name)

    def encode(self, request: dict, scores: np.ndarray) -> tuple[bytes, dict[str, str]]:
        return codec.http_infer_response(self.model_name, request, scores, self.version, self.regions)
