"""HTTP/1.1 request heads read by llhttp (httptools, the parser inside uvicorn and aiohttp), plus the checks it
leaves to the server: Host, the HTTP version, transfer codings and a head size limit.

Why: a hand-written reader accepted framing that RFC 9112 says to reject (duplicate Content-Length, obs-fold,
whitespace before the colon, ``+N`` lengths...), shapes a proxy parsing differently turns into request smuggling.

Only heads go through the parser: bodies are framed by the caller from ``Head.length`` (so it can receive them in
place).  A head whose exact bytes were accepted before is not parsed again (a client repeats its head call after
call; parsing it cost several µs of a batch-1 query).  Knows nothing of what is served.
"""

from __future__ import annotations

from typing import NamedTuple

import httptools

MAX_HEAD_BYTES = 64 * 1024  # the request line and headers together, whether they arrive in pieces or at once
HEADS = 64  # heads remembered parsed; more distinct ones start the store over
HEAD_KEY_BYTES = 2048  # a longer head is parsed every time
TERMINATOR = b"\r\n\r\n"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n"  # how an HTTP/2 client with prior knowledge (gRPC's) opens (RFC 9113 3.4)
HTTP2_ON_HTTP1 = "an HTTP/2 connection preface: this port speaks HTTP/1.1; HTTP/2 and gRPC are on the gRPC port"


class HeadError(Exception):
    """A head the server must refuse and then close the connection: ``status`` is 400, 431 or 501."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Head(NamedTuple):
    """A parsed request head.  ``headers``: lowercased names, values stripped, repeated fields joined with ", "
    (shared between requests with the same head: read it, never change it).  ``length``: the body's bytes, or -1
    for a chunked body."""

    method: str
    path: str
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: dict[str, str]
    length: int

    @property
    def chunked(self) -> bool:
        return self.length < 0


_heads: dict[bytes, Head] = {}


class _Callbacks:
    """What llhttp reads of a head, through its callbacks.  Apart from the reader: a parser holds its callbacks, so
    a reader that were its own callbacks would make a cycle with its parser, freed only by the cyclic GC (each
    connection closed mid-head, or refused)."""

    __slots__ = ("url", "fields", "complete")

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        self.complete = True  # the reader checks the head once llhttp returns


class HeadReader:
    """Reads one request head at a time from a connection's buffer, feeding llhttp each byte once as it arrives
    (a broken head is refused before its end arrives).  Ready for the next head once one is returned."""

    __slots__ = ("_parser", "_read", "_fed", "_done")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._parser: httptools.HttpRequestParser | None = None
        self._read: _Callbacks | None = None
        self._fed = 0  # bytes of the buffer the parser has seen
        self._done: Head | None = None

    def read(self, buf: bytes | bytearray) -> tuple[int, Head] | None:
        """``(head_end, head)`` once ``buf`` (the bytes of the connection from this request's first byte on)
        holds a whole head; None while it does not.  Raises ``HeadError``."""
        end = buf.find(TERMINATOR, max(0, self._fed - 3), MAX_HEAD_BYTES + 4)
        if end < 0:
            if len(buf) >= MAX_HEAD_BYTES + 4:
                raise HeadError(431, f"request head longer than {MAX_HEAD_BYTES} bytes")
            self._feed(buf, len(buf))
            if self._done is not None:  # llhttp saw a whole head where there is no blank line yet
                raise HeadError(400, "malformed request head")
            return None
        end += 4
        if end > MAX_HEAD_BYTES:
            raise HeadError(431, f"request head longer than {MAX_HEAD_BYTES} bytes")
        raw = bytes(buf[:end])
        head = _heads.get(raw)
        if head is None:
            self._feed(buf, end)
            head = self._done
            if head is None:
                raise HeadError(400, HTTP2_ON_HTTP1 if raw.startswith(HTTP2_PREFACE) else "malformed request head")
            if end <= HEAD_KEY_BYTES:
                if len(_heads) >= HEADS:
                    _heads.clear()
                _heads[raw] = head
        if self._parser is not None:
            self.reset()
        return end, head

    def _feed(self, buf: bytes | bytearray, upto: int) -> None:
        if upto <= self._fed:
            return
        if self._parser is None:
            self._read = _Callbacks()
            self._parser = httptools.HttpRequestParser(self._read)
        data = bytes(buf[self._fed : upto])
        self._fed = upto
        error = None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # Upgrade or CONNECT: the head is whole; nothing is upgraded here
            pass
        except httptools.HttpParserError as exc:
            error = HeadError(400, f"malformed request head: {exc}")
        if self._read.complete and self._done is None:  # type: ignore[union-attr]
            self._done = self._checked()  # its refusals first, as llhttp checks how a body is framed after them
        if error is not None:
            try:
                raise error
            finally:  # not left in this frame, which its traceback holds: the two would make a cycle
                del error

    def _checked(self) -> Head:
        """The head from what llhttp read, with the checks llhttp does not make."""
        parser, read = self._parser, self._read
        version = "HTTP/" + parser.get_http_version()  # type: ignore[union-attr]
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise HeadError(400, f"unsupported HTTP version {version!r}")
        headers: dict[str, str] = {}
        hosts = 0
        for raw_name, raw_value in read.fields:  # type: ignore[union-attr]
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1").strip(" \t")
            hosts += name == "host"
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if hosts > 1 or (hosts == 0 and version == "HTTP/1.1"):
            raise HeadError(400, "an HTTP/1.1 request needs exactly one Host header" if hosts == 0
                            else "more than one Host header")
        length = int(headers.get("content-length", "0"))  # llhttp let through digits only, and one such header
        coding = headers.get("transfer-encoding")
        if coding is not None:
            if version == "HTTP/1.0":
                raise HeadError(400, "Transfer-Encoding in an HTTP/1.0 request")
            if coding.lower() != "chunked":
                raise HeadError(501, f"Transfer-Encoding {coding[:40]!r} is not implemented (only chunked)")
            length = -1
        method = parser.get_method().decode("ascii")  # type: ignore[union-attr]
        return Head(method, read.url.decode("latin-1"), version, headers, length)  # type: ignore[union-attr]


MAX_DIGITS = 18  # the longest number ``digits`` takes: any int64 count of bytes, far from ``int``'s 4300-digit limit


def digits(value: str) -> bool:
    """Whether a header value is a decimal number of at most ``MAX_DIGITS`` digits: ASCII digits only
    (``str.isdigit`` also takes ``²`` of a head read as Latin-1, which ``int`` then refuses), and few of them (a
    client's thousands of digits would make ``int`` raise where the caller reads it)."""
    return len(value) <= MAX_DIGITS and value.isascii() and value.isdigit()


def read_head(buf: bytes | bytearray) -> tuple[int, Head] | None:
    """``HeadReader().read(buf)``: a head read from bytes at once (tests, and callers without a connection)."""
    return HeadReader().read(buf)


def keep_alive(version: str, headers: dict[str, str]) -> bool:
    """Whether the connection stays open after this message (RFC 9112 9.3): HTTP/1.1 unless ``Connection`` names
    ``close``, HTTP/1.0 only if it names ``keep-alive``.  Headers by lower-case name; the same rule for a request
    (the server) and for a response (``measure/http_client``)."""
    conn = headers.get("connection", "").lower()
    if "," not in conn:  # one token or none: every query of a plain client (this runs per request)
        conn = conn.strip()
        return conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    tokens = {t.strip() for t in conn.split(",")}
    return "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens and "close" not in tokens
