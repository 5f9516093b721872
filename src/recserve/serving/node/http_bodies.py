"""Request bodies on the supervisor's HTTP front end (aiohttp): received whole within ``read_timeout_s`` and their
content codings undone within ``max_body_bytes``, with the worker's statuses.

aiohttp's own inflation is off (``auto_decompress=False``): a coding it did not know answered aiohttp's plain-text
400, one it knew but the docs do not promise (``br``) was accepted, and a corrupt stream reached the handler as an
unexpected error.  Here gzip (``x-gzip`` too, RFC 9110 8.4.1.3) and deflate are undone, several codings in the
reverse of the order applied; any other answers 415 naming those two.  A client that stops sending gets 408, one
that leaves mid-body is no server error (status 499, nginx's "client closed request", logged at debug).
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

from recserve.serving.wire.errors import InferError


class UnreadableBody(InferError):
    """What aiohttp's parser refused after a request's head (a chunk-size line, a trailer section past the head's
    limits), as that request's answer (``handover.JsonErrors``): the connection closes after it, since the parser
    cannot read on."""


CODINGS = "gzip, deflate"  # the content codings a request body may carry (the 415's ``Accept-Encoding``)
_WBITS = {"gzip": 31, "x-gzip": 31}


async def request_body(request: web.Request, timeout_s: float, limit: int) -> bytes:
    """The body of ``request`` as sent before any content coding (b"" when it has none).

    Raises ``InferError``: ``slow_client`` (not all received within ``timeout_s``), ``too_large`` (over
    ``limit`` as sent or inflated), ``client_gone``, ``invalid`` (malformed framing or coding),
    ``unsupported_media`` (a coding other than gzip and deflate), or an ``UnreadableBody`` (``head_too_large``: a
    trailer section past the head's limits; ``invalid``) when the parser refused what followed the head."""
    if not request.body_exists:
        return b""
    codings = _codings(request.headers.get("Content-Encoding", ""))  # refused before the body is waited for
    try:
        async with asyncio.timeout(timeout_s):
            body = await request.read()
    except TimeoutError:
        raise InferError("slow_client", f"request body not received within {timeout_s:g} s", "body") from None
    except web.HTTPRequestEntityTooLarge as exc:
        raise InferError("too_large", f"body: {exc.text}", "body") from None
    except ConnectionResetError:
        raise InferError("client_gone", "the client closed the connection before its body arrived") from None
    except web.RequestPayloadError as exc:
        raise InferError("invalid", f"body: malformed framing: {exc}", "body") from None
    body_error = getattr(request.protocol, "body_error", None)  # ``handover.JsonErrors``, the server's protocol
    if body_error is not None and (error := body_error(request.content)) is not None:
        raise error
    for coding in reversed(codings):
        body = inflate(body, coding, limit)
    return body


def framing_error(request: web.Request) -> InferError | None:
    """What the workers' head reader refuses (``serving/transport/http1.py``) and aiohttp's parser lets through: a
    request line with no version (HTTP/0.9, whose answer would have no head), a transfer coding in an HTTP/1.0 request
    (400; RFC 9112 6.1: its framing is faulty) or one other than chunked alone (501).  Either way the connection must
    close after the answer."""
    if request.version < (1, 0):
        major, minor = request.version
        return InferError("invalid", f"request: unsupported HTTP version 'HTTP/{major}.{minor}'")
    coding = request.headers.get("Transfer-Encoding")
    if coding is None:
        return None
    if request.version < (1, 1):
        return InferError("invalid", "request: Transfer-Encoding in an HTTP/1.0 request")
    if coding.strip().lower() != "chunked":
        return InferError("unsupported", f"request: Transfer-Encoding {coding[:40]!r} is not implemented (only "
                          "chunked)")
    return None


def _codings(header: str) -> list[str]:
    """The content codings a ``Content-Encoding`` value lists, ``identity`` dropped; 415 for any not undone here."""
    codings = [c.strip().lower() for c in header.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    for coding in codings:
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise InferError("unsupported_media", f"Content-Encoding {coding!r} is not supported: send the body "
                             f"as is or with one of {CODINGS}", "Content-Encoding")
    return codings


def inflate(data: bytes, coding: str, limit: int) -> bytes:
    """``data`` with one content coding undone, at most ``limit`` bytes of it (``too_large`` past that).  gzip may
    hold several members (RFC 1952 2.2); deflate is the zlib format, raw deflate accepted as well."""
    wbits = _WBITS.get(coding) or (15 if _zlib_header(data) else -15)
    out = bytearray()
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            out += inflater.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise InferError("invalid", f"body: not valid {coding}: {exc}", "body") from None
        if len(out) > limit:
            raise InferError("too_large", f"body: more than {limit} bytes once inflated ({coding})", "body")
        if not inflater.eof:
            raise InferError("invalid", f"body: the {coding} stream ends early", "body")
        data = inflater.unused_data
        if not data or wbits != 31:
            break
    if data:
        raise InferError("invalid", f"body: {len(data)} bytes after the end of the {coding} stream", "body")
    return bytes(out)


def _zlib_header(data: bytes) -> bool:
    """Whether ``data`` opens with a zlib header (RFC 1950 2.2: deflate method, a check that divides by 31)."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
