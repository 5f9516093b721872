"""The one error type of the data plane and the one table that maps its codes onto HTTP and gRPC.

HTTP (``serving/node/http.py``), gRPC (``serving/node/grpc_service.py``), the codec and the router all raise
or translate :class:`InferError`; keeping the status table here means an error code answers with
the same meaning over both protocols.  gRPC codes are stored by name so that importing this module
(and the numpy-only codec that raises it) does not import grpc.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple


class Status(NamedTuple):
    http: int
    grpc: str  # a grpc.StatusCode member name


STATUS: dict[str, Status] = {
    "invalid": Status(400, "INVALID_ARGUMENT"),
    "unauthorized": Status(401, "UNAUTHENTICATED"),
    "not_found": Status(404, "NOT_FOUND"),
    "too_large": Status(413, "RESOURCE_EXHAUSTED"),
    "slow_client": Status(408, "DEADLINE_EXCEEDED"),
    "unavailable": Status(503, "UNAVAILABLE"),
    "deadline": Status(504, "DEADLINE_EXCEEDED"),
    "internal": Status(500, "INTERNAL"),
    "data_loss": Status(500, "DATA_LOSS"),  # a corrupt SSD table block: the server's data, not the request
    "unsupported": Status(501, "UNIMPLEMENTED"),
    "head_too_large": Status(431, "RESOURCE_EXHAUSTED"),  # an HTTP/1.1 request head past 64 KiB
    "unsupported_media": Status(415, "UNIMPLEMENTED"),  # a body's content coding other than gzip and deflate
    "client_gone": Status(499, "CANCELLED"),  # the client left mid-request (nginx's 499); no answer reaches it
}
"""Error code -> (HTTP status, gRPC status code name); an unknown code is answered as ``internal``."""


_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)+([\w.@+-]+)")


def redact_paths(text: str) -> str:
    """``text`` with absolute file paths cut to their last component: an error body must not map the host."""
    return _ABSOLUTE_PATH.sub(r".../\1", text)


class InferError(Exception):
    """A request that cannot be answered with scores; ``code`` is a key of :data:`STATUS`."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field

    def public_message(self) -> str:
        """The message as clients see it (HTTP body, gRPC details): absolute paths redacted."""
        return redact_paths(str(self))

    @property
    def status(self) -> Status:
        return STATUS.get(self.code, STATUS["internal"])

    def body(self) -> dict[str, Any]:
        """The JSON error body every HTTP front end answers with."""
        body: dict[str, Any] = {"error": self.public_message()}
        if self.field:
            body["field"] = self.field
        return body


def grpc_code(exc: InferError) -> Any:
    """The ``grpc.StatusCode`` for ``exc`` (grpc imported here, only by the gRPC front end)."""
    import grpc

    return grpc.StatusCode[exc.status.grpc]
