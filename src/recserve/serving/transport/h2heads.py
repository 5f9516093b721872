"""Request header blocks of an HTTP/2 connection: HEADERS and CONTINUATION assembled into blocks (bounded in bytes
and frames), decoded with HPACK (blocks that leave the table alone remembered), checked, and turned into calls of the
methods served.  Sans-IO."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hpack import Decoder
from hpack.exceptions import HPACKError

from recserve.serving.transport.h2frames import (
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    MAX_HEADER_BLOCK,
    MAX_HEADER_LIST,
    MAX_PURE_BLOCKS,
    MAX_STREAMS,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RESERVED_HEADERS,
    UNIMPLEMENTED,
    H2Error,
    Metadata,
    malformed,
    metadatum,
    timeout_s,
    unpad,
)
from recserve.serving.transport.h2limits import FloodGuard
from recserve.serving.transport.h2replies import ReplyWriter
from recserve.serving.transport.h2requests import RequestReader
from recserve.serving.transport.h2streams import Call, MessageSink, Method, Stream, StreamTable

log = logging.getLogger(__name__)
Head = tuple[str, "float | None", "bytes | None", bytes, Metadata, "str | None"]


class HeadDecoder:
    """What a call needs of its header block: the method's path, ``grpc-timeout`` in seconds (None if absent), the
    HTTP status refusing a request that is not gRPC (None if it is), ``grpc-encoding``, the client's own metadata
    (a forwarded call carries it on: the control token's ``authorization``) and why the block is malformed (None
    if it is not).

    A block that leaves the dynamic table as it found it (indexed fields, literals not indexed) decodes the same
    until a block that changes the table arrives, so its head is remembered by its bytes: a client sends the same
    few such blocks call after call (grpc-core's and tritonclient's all indexed; nghttp2's with ``:path`` and
    ``content-length`` never indexed), each decoded once."""

    __slots__ = ("decoder", "pure")

    def __init__(self) -> None:
        self.decoder = Decoder()
        self.decoder.max_header_list_size = MAX_HEADER_LIST
        self.pure: dict[bytes, Head] = {}  # heads of blocks that left the table alone, at most ``MAX_PURE_BLOCKS``

    def decode(self, block: bytes) -> Head:
        head = self.pure.get(block)
        if head is not None:
            return head
        table = self.decoder.header_table
        entries = table.dynamic_entries
        first, count, size = entries[0] if entries else None, len(entries), table.maxsize
        try:
            headers = self.decoder.decode(block, raw=True)
        except HPACKError as exc:
            raise H2Error(COMPRESSION_ERROR, f"header block: {exc}") from exc
        head = _head(headers)
        # an insertion puts a new entry first (``first`` is still referenced here, so no new one shares its id); a
        # size update changes ``maxsize``; an eviction changes the count
        if (entries[0] if entries else None) is first and len(entries) == count and table.maxsize == size:
            if len(self.pure) >= MAX_PURE_BLOCKS:  # a client sending ever new blocks: bounded
                self.pure.clear()
            self.pure[block] = head
        else:
            self.pure.clear()  # the table changed: a remembered block could decode differently now
        return head


def _head(headers: list[tuple[bytes, bytes]]) -> Head:
    """A decoded header block read as ``HeadDecoder`` describes."""
    path = timeout = method = content_type = encoding = b""
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name == b":path":
            path = value
        elif name == b"grpc-timeout":
            timeout = value
        elif name == b":method":
            method = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-encoding":
            encoding = value
        elif not name.startswith(b":") and name not in RESERVED_HEADERS and not name.startswith(b"grpc-"):
            metadata.append(metadatum(name, value))
    refusal = (None if method == b"POST" and content_type.startswith(b"application/grpc")
               else b"415" if method == b"POST" else b"405")
    return (path.decode("latin-1"), timeout_s(timeout) if timeout else None, refusal, encoding, tuple(metadata),
            malformed(headers))


class CallOpener:
    """HEADERS and CONTINUATION frames in: new streams, each a call of the method its path names (or refused,
    reset or answered with an HTTP status), and request trailers that end a stream."""

    def __init__(self, streams: StreamTable, replies: ReplyWriter, requests: RequestReader,
                 methods: Callable[[str], Method | None], new_call: Callable[..., Call],
                 new_queue: Callable[[], MessageSink], clock: Callable[[], float], guard: FloodGuard,
                 calm: Callable[[str | None], None], stream_window: int,
                 on_abuse: Callable[[str], None] | None = None) -> None:
        self.streams, self.open, self.replies, self.requests = streams, streams.open, replies, requests
        self.methods, self.new_call, self.new_queue, self.clock = methods, new_call, new_queue, clock
        self.guard, self.calm, self.on_abuse = guard, calm, on_abuse
        self.stream_window = stream_window  # each new stream's receive window
        self.heads = HeadDecoder()
        self.continuing: Stream | None = None  # a HEADERS frame without END_HEADERS: only CONTINUATION may follow
        self.block = bytearray()  # its header block so far
        self.refused = 0  # new streams refused (REFUSED_STREAM) after GOAWAY: their clients retry them elsewhere

    def headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = unpad(flags, payload, priority=True) if flags & (PADDED | PRIORITY_FLAG) else payload
        streams = self.streams
        stream = self.open.get(stream_id)
        if stream is not None:  # trailers from the client: they end the request
            if not flags & END_STREAM:
                raise H2Error(PROTOCOL_ERROR, "a second header block that does not end the stream")
            stream.ended = True
        elif stream_id in streams.reset_ids:  # sent before our reset reached the client: read (HPACK) and ignored
            stream = Stream(stream_id, 0)
            stream.ended = True
        else:
            if stream_id % 2 == 0 or stream_id <= streams.last_id:
                raise H2Error(PROTOCOL_ERROR, f"stream {stream_id} is not a new client stream")
            streams.last_id = stream_id
            stream = Stream(stream_id, self.replies.initial_send_window, self.stream_window, self.clock())
            stream.ended = bool(flags & END_STREAM)
            streams.add(stream)
            self.guard.earned_updates()  # the window announcement a client may send for it
        if flags & END_HEADERS:  # the whole block in this frame (the usual case): no copy into ``self.block``
            if len(block) > MAX_HEADER_BLOCK:
                raise H2Error(ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} bytes")
            self._header_block(stream, block)
        else:
            self._add_to_block(block)
            self.continuing = stream
            self.guard.continuations = 0

    def continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self.continuing
        if stream is None or stream.id != stream_id:
            raise H2Error(PROTOCOL_ERROR, "CONTINUATION without a header block")
        self.calm(self.guard.continuation())
        self._add_to_block(payload)
        if flags & END_HEADERS:
            self.continuing = None
            block, self.block = bytes(self.block), bytearray()
            self._header_block(stream, block)

    def _add_to_block(self, fragment: bytes) -> None:
        self.block += fragment
        if len(self.block) > MAX_HEADER_BLOCK:
            raise H2Error(ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} bytes")

    def _header_block(self, stream: Stream, block: bytes) -> None:
        path, seconds, refusal, encoding, metadata, why = self.heads.decode(block)
        if self.open.get(stream.id) is not stream:  # a stream we reset: its block kept HPACK in step, no more
            return
        if stream.call is not None:  # request trailers: ignored, the stream has ended
            self.requests.request_ended(stream)
            return
        if why is not None:  # RFC 9113 8.1.1: a stream error, the connection serves on
            log.debug("gRPC stream %d reset: malformed request (%s)", stream.id, why)
            self.streams.reset(stream, PROTOCOL_ERROR)
            return
        if self.replies.closing or self.streams.too_many():  # retried by gRPC clients (nothing of it was run)
            if self.replies.closing:
                self.refused += 1
            elif self.on_abuse is not None and len(self.open) <= MAX_STREAMS:
                self.on_abuse("too_many_streams")  # the server's budget
            self.streams.reset(stream, REFUSED_STREAM)
            return
        call = self.new_call(self.replies, stream, path, None if seconds is None else self.clock() + seconds,
                             metadata)
        stream.call = call
        stream.encoding = encoding
        if refusal is not None:
            self.replies.send_status(stream, refusal)
            return
        served: Any = self.methods(path)
        stream.method = served
        if served is None:
            call.finish(UNIMPLEMENTED, f"method {call.method} is not implemented")
        elif served.sink is not None:
            call.requests = served.sink(call)
        elif served.stream is not None:
            call.requests = self.new_queue()
            served.stream(call)
        if stream.ended:
            self.requests.request_ended(stream)
