"""The admission decision for an HTTP query before its tensors are read: from its JSON header (binary extension) or
its skeleton (plain JSON without its ``data`` arrays).

Why: under overload, receiving and decoding a large query that is then shed took most of a worker's core (~2 ms
for a batch-256 plain-JSON query against ~0.1 ms for its skeleton), so the next requests waited in the socket
before admission saw them.  Refused here, a query costs a tenth of its decode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recserve.serving.wire import codec
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.admission import AdmissionQueue


class EarlyRefusal:
    """A worker's early verdicts: None (decode the query as usual) or the error to answer it with unread.

    ``offload``: the worker's accelerator client, or None (read at each verdict: it is set after the plane)."""

    def __init__(self, admission: AdmissionQueue, offload: Callable[[], Any]) -> None:
        self.admission = admission
        self.offload = offload

    def from_header(self, header: bytes, arrived: float | None = None) -> InferError | None:
        """The verdict for a query known only by its JSON header (its size and ``timeout``), or None when it would
        be admitted or the header cannot tell (the whole request is then decoded as usual).  A query for an
        accelerator worker is refused here when that worker is behind (``AcceleratorClient.behind``)."""
        if not self.admission.busy() and self.offload() is None:
            return None  # alone, a query is always tried
        try:
            request = codec.parse_header(header)
        except Exception:  # noqa: BLE001 - malformed: the full decode answers it with the exact error
            return None
        return self._verdict(request, arrived)

    def from_json(self, body: bytes | bytearray | memoryview, arrived: float | None = None) -> InferError | None:
        """``from_header`` for a plain-JSON query, judged from its skeleton (``codec.json_skeleton``: the request
        without its ``data`` arrays), or None when it would be admitted or the skeleton cannot tell."""
        if not self.admission.busy() and self.offload() is None:
            return None
        request = codec.json_skeleton(body)
        return None if request is None else self._verdict(request, arrived)

    def _verdict(self, request: dict, arrived: float | None) -> InferError | None:
        admission, offload = self.admission, self.offload()
        try:
            items, timeout = codec.dense_rows(request), codec.request_timeout_s(request)
        except Exception:  # noqa: BLE001 - malformed: the full decode answers it with the exact error
            return None
        if offload is not None and offload.takes(items):
            return None if admission.draining else offload.behind(admission.deadline(timeout, arrived))
        if not admission.busy():
            return None
        return admission.refusal(items, admission.deadline(timeout, arrived))
