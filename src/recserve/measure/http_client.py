"""A lean HTTP/1.1 client for the load generator: keep-alive connections, pre-encoded requests.

Why not aiohttp: a load generator must cost much less than what it measures.  aiohttp's client spends
~0.2 ms of CPU per query (request building, header multidicts, stream readers, timers), so on a 2-core host the
generator could not offer 5,000 queries/s and starved the servers it measured.  Here a request is bytes built
once per pooled query (``encode_post``), sent with one write on an idle keep-alive connection, and its response
is read by a small protocol that finds the head, then ``Content-Length`` (or chunked) body bytes.
"""

from __future__ import annotations

import asyncio
import collections
import re
import ssl
from dataclasses import dataclass
from urllib.parse import urlparse

from recserve.serving.transport.http1 import digits, keep_alive


class HttpClientError(Exception):
    """The connection failed or the response was not HTTP/1.x."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass(frozen=True)
class Endpoint:
    """Where ``http[s]://host[:port][/prefix]`` points: what an :class:`HttpPool` connects to, and the path
    prefix (a Ray Serve route, say) the requests' paths go under."""

    host: str
    port: int
    tls: bool
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Raises ValueError naming ``url`` when it is not an http(s) URL with a host."""
        parsed = urlparse(url.rstrip("/"))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"must be http[s]://host[:port][/prefix], got {url!r}")
        tls = parsed.scheme == "https"
        return cls(parsed.hostname, parsed.port or (443 if tls else 80), tls, parsed.path.rstrip("/"))

    def pool(self, limit: int = 256, reuse: str = "oldest", retry_stale: bool = False) -> HttpPool:
        return HttpPool(self.host, self.port, limit, self.tls, reuse, retry_stale)


def encode_post(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The whole request, once: head and body in one buffer (one write per query)."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request outstanding (no pipelining)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[Response] | None = None
        self.closed = False
        self.answered = False  # a byte of the current request's answer has arrived
        self._head: tuple[int, int, dict[str, str]] | None = None  # (body start, status, headers)
        self._version = "HTTP/1.1"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Response]:
        self.waiter = loop.create_future()
        self.answered = False
        self.transport.write(request)  # type: ignore[union-attr]
        return self.waiter

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():  # bytes no request asked for: the stream is out of step
            self.close()
            return
        self.buf += data
        self.answered = True
        if not self.waiter.done():
            try:
                response = self._parse()
            except HttpClientError as exc:
                self.waiter.set_exception(exc)
                self.close()
                return
            if response is not None:
                self.waiter.set_result(response)

    def _parse(self) -> Response | None:
        if self._head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return None
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not digits(parts[1]):
                raise HttpClientError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self._head = (end + 4, int(parts[1]), headers)
            self._version = parts[0]
        start, status, headers = self._head
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body, used = _dechunk(self.buf, start)
            if body is None:
                return None
        else:
            length = headers.get("content-length", "0")
            if not digits(length):
                raise HttpClientError(f"malformed Content-Length {length[:40]!r}")
            used = start + int(length)
            if len(self.buf) < used:
                return None
            body = bytes(self.buf[start:used])
        del self.buf[:used]
        self._head = None
        if not keep_alive(self._version, headers) or self.buf:  # bytes past the answer: not reused
            self.closed = True
        return Response(status, headers, body)

    def eof_received(self) -> bool:
        self._lost("the server closed the connection")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(f"connection lost: {exc}" if exc else "connection closed")

    def _lost(self, why: str) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(HttpClientError(why))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


_HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")  # 1*HEXDIG, at most 64 bits: not int()'s sign, "0x" or "_"


def _dechunk(buf: bytearray, start: int) -> tuple[bytes | None, int]:
    """A complete chunked body from ``start`` and the bytes it used, or (None, 0) while incomplete."""
    out, at = bytearray(), start
    while True:
        eol = buf.find(b"\r\n", at)
        if eol < 0:
            return None, 0
        text = bytes(buf[at:eol]).split(b";")[0].rstrip(b" \t")  # chunk-size [BWS ; ext] (RFC 9112 7.1)
        if not _HEX_SIZE.fullmatch(text):
            raise HttpClientError(f"malformed chunk size {text[:40]!r}")
        size = int(text, 16)
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # trailers end with an empty line
            return (bytes(out), end + 4) if end >= 0 else (None, 0)
        if len(buf) < eol + 2 + size + 2:
            return None, 0
        out += buf[eol + 2 : eol + 2 + size]
        at = eol + 2 + size + 2


class HttpPool:
    """Keep-alive connections to one host: a query takes the connection idle longest (or opens one, up to
    ``limit``).  Oldest first spreads queries over every open connection, as many independent clients would: most
    recent first sent almost all of them down one connection, i.e. to one of a multi-process server's workers."""

    def __init__(self, host: str, port: int, limit: int = 256, tls: bool = False, reuse: str = "oldest",
                 retry_stale: bool = False) -> None:
        """``reuse="newest"`` takes the most recently used idle connection instead (what aiohttp's pool does): a
        benchmark of how a server copes with clients that keep most traffic on few connections.
        ``retry_stale``: a request whose kept-alive connection closes before any byte of the answer is sent once
        more on a new connection (the server closed it idle as the request left, RFC 9112 9.3.1); only for
        requests safe to repeat, such as scoring queries through a router."""
        if reuse not in ("oldest", "newest"):
            raise ValueError(f"reuse must be 'oldest' or 'newest', got {reuse!r}")
        self.host, self.port = host, port
        self._newest = reuse == "newest"
        self._ssl = ssl.create_default_context() if tls else None
        self._idle: collections.deque[_Connection] = collections.deque()
        self._slots = asyncio.Semaphore(limit)
        self._retry_stale = retry_stale

    async def send(self, request: bytes, timeout_s: float) -> Response:
        """Send a request built by ``encode_post``; TimeoutError past ``timeout_s``, HttpClientError if the
        connection fails (refused, reset, closed before the answer)."""
        loop = asyncio.get_running_loop()
        async with self._slots:
            deadline = loop.time() + timeout_s
            conn = self._take_idle() or await self._connect(loop)
            reused = conn.answered  # it has answered an earlier request
            try:
                return await self._exchange(conn, request, timeout_s, loop)
            except HttpClientError:
                if not (self._retry_stale and reused and not conn.answered):
                    raise
            conn = await self._connect(loop)
            return await self._exchange(conn, request, max(0.0, deadline - loop.time()), loop)

    async def _exchange(self, conn: _Connection, request: bytes, timeout_s: float,
                        loop: asyncio.AbstractEventLoop) -> Response:
        answer = conn.send(request, loop)
        timer = loop.call_later(timeout_s, _expire, answer)
        try:
            response = await answer
        except BaseException:
            conn.close()  # a late answer would be read as the next query's
            raise
        finally:
            timer.cancel()
        if conn.closed:
            conn.close()
        else:
            self._idle.append(conn)
        return response

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop() if self._newest else self._idle.popleft()
            if not conn.closed:
                return conn
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port, ssl=self._ssl)
        except OSError as exc:
            raise HttpClientError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def _expire(answer: asyncio.Future) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError("no answer within the query's timeout"))
