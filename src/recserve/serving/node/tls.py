"""TLS for the node's HTTP and gRPC ports, from the node config's ``tls_cert`` / ``tls_key`` (PEM files).

With TLS the node runs the single front-end layout (``front_end: server``): in data plane v2 a worker hands a
connection it cannot answer to another process by file descriptor, and a TLS session's state cannot follow
the descriptor; gRPC clients then meet the workers' HTTP/2 stack (``h2grpc``) in the server process, over
asyncio's TLS with ALPN ``h2``.  Without TLS both ports stay plaintext (meant for loopback or a trusted network).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from recserve.errors import SpecError


def _pem(path: str | None, what: str) -> bytes:
    try:
        return Path(str(path)).read_bytes()
    except OSError as exc:
        raise SpecError(f"node config: {what} {Path(str(path)).name!r} cannot be read: {exc.strerror}") from exc


def http_context(config: Any) -> ssl.SSLContext | None:
    """The aiohttp site's server context, or None for plaintext."""
    if not config.tls_cert:
        return None
    _pem(config.tls_cert, "tls_cert")  # a clear error naming the file before ssl's own
    _pem(config.tls_key, "tls_key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except ssl.SSLError as exc:
        raise SpecError(f"node config: tls_cert/tls_key do not form a certificate chain and key: {exc}") from exc
    return context


def grpc_context(config: Any) -> ssl.SSLContext | None:
    """The gRPC port's server context (the HTTP one, offering ALPN ``h2``), or None for plaintext (h2c)."""
    context = http_context(config)
    if context is not None:
        context.set_alpn_protocols(["h2"])
    return context
