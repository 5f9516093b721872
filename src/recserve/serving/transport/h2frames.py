"""HTTP/2 and gRPC-over-HTTP/2 wire constants and pure encoders: frames, the constant HPACK blocks of replies,
trailers, and the checks of a request's header fields.  No state, no I/O."""

from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Any

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x2, 0x3, 0x6
REFUSED_STREAM, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x9, 0xB
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 0x1, 0x3, 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
RECEIVE_FRAME = 1 << 20  # the largest frame we accept (advertised): fewer frames for a large query
HOLD_BYTES = 16 << 20  # answers held for closed client windows (at least two largest messages): then a reset
HELD_CONNECTION = 16 << 20  # request bytes of incomplete messages a connection holds (at least two largest ones)
HELD_WORKER = 64 << 20  # the same, over a server's connections (at least four largest messages)
FRAMES_PER_TURN = 256  # frames handled per read before the loop runs other work: the rest waits, reading paused
MAX_STREAMS = 4096  # concurrent calls per connection (advertised); admission proper is the worker's queue
SERVER_STREAMS = 8192  # ... and over a server's (a worker's) connections: many connections would multiply the first
FEW_STREAMS = 8  # a connection with no more calls open than this is served past SERVER_STREAMS: a client with a few
# calls is not refused for the many of others, and over a server's connections these add a bounded number
MAX_HEADER_BLOCK = 64 << 10  # a header block's encoded bytes (HEADERS + CONTINUATION): a CONTINUATION flood ends here
MAX_HEADER_LIST = 16 << 10  # a block's decoded size (RFC 7541 4.1: 32 a field and more), grpc-core's hard limit on
# metadata: past it HPACK stops with COMPRESSION_ERROR before a block of tiny fields costs much Python
# (docs/decisions/2026-11-30-grpc-request-fields-bounded.md)
LAND_BYTES = 64 << 10  # a unary request message from this size on is assembled in place (``Method.land``)
LAND_LIMIT = 2  # messages being assembled at once on a connection hold at most this many max messages
MAX_PURE_BLOCKS = 64  # header blocks that leave the HPACK table alone, remembered per connection (clients repeat few)
RESERVED_HEADERS = frozenset({b"content-type", b"te", b"user-agent"})  # HTTP/2 and gRPC's own, not metadata
CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                 b"upgrade"})  # HTTP/1.1 fields a request over HTTP/2 must not carry (RFC 9113 8.2.2)
REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
RESETS_REMEMBERED = 1024  # streams we reset whose late frames are ignored (RFC 9113 5.1), the most recent ones
Metadata = tuple[tuple[str, "str | bytes"], ...]
# the PINGs of a graceful close: the first goes with the first GOAWAY; its acknowledgement sends the second, and
# the second's allows the final GOAWAY (``H2Connection.close_gracefully`` says why two)
GOAWAY_PING, GOAWAY_PING_AGAIN = b"goaway\x00\x01", b"goaway\x00\x02"

# gRPC status codes (grpc.StatusCode values), named here so that this layer needs no grpc import
OK, INVALID_ARGUMENT, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 3, 4, 8, 12, 13
TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}

HEAD = struct.Struct(">IBI")  # a frame's 9-byte header: length << 8 | type, flags, stream id


class H2Error(Exception):
    """A connection-level protocol error: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return HEAD.pack(len(payload) << 8 | kind, flags, stream) + payload


def goaway_frame(last_id: int, code: int = NO_ERROR, reason: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_id.to_bytes(4, "big") + code.to_bytes(4, "big") + reason)


def unpad(flags: int, payload: Any, priority: bool) -> Any:
    """A HEADERS or DATA payload without its padding (and, ``priority``, its priority fields)."""
    start = 0
    pad = 0
    if flags & PADDED:
        if not payload:
            raise H2Error(PROTOCOL_ERROR, "padded frame without its pad length")
        pad, start = payload[0], 1
    if priority and flags & PRIORITY_FLAG:
        start += 5
    if start + pad > len(payload):
        raise H2Error(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[start:len(payload) - pad] if start or pad else payload


def hpack_integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) whose first byte carries ``first`` in the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out, value = bytearray((first | limit,)), value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman: no HPACK state on either side."""
    return b"\x00" + hpack_integer(len(name), 7) + name + hpack_integer(len(value), 7) + value


def status_block(status: bytes) -> bytes:
    """``:status`` (static name 8) with a literal value: an HTTP answer to a request that is not gRPC."""
    return b"\x08" + hpack_integer(len(status), 7) + status


PERCENT_ENCODED = re.compile(rb"[^\x20-\x24\x26-\x7e]+")  # runs of the bytes ``grpc-message`` spells as %XX
_PERCENT = [b"%%%02X" % b for b in range(256)]


def percent_encoded(message: str) -> bytes:
    """``grpc-message``: UTF-8, with every byte outside printable ASCII (and '%') as %XX (gRPC's rule), in one
    regular-expression pass over runs of such bytes: every refusal under overload is encoded here."""
    return PERCENT_ENCODED.sub(lambda run: b"".join(map(_PERCENT.__getitem__, run.group())), message.encode())


RESPONSE_HEADERS = b"\x88" + literal(b"content-type", b"application/grpc")  # 0x88: ":status: 200", static index 8
TRAILERS_OK = literal(b"grpc-status", b"0")
# a unary answer that the windows admit whole, as one write: HEADERS frame and block, DATA frame header and the
# message's 5-byte prefix (packed in one call), the message, then the trailers' HEADERS frame
REPLY_HEAD = struct.Struct(f">IBI{len(RESPONSE_HEADERS)}sIBIBI")
REPLY_TAIL = struct.Struct(f">IBI{len(TRAILERS_OK)}s")
MESSAGE_HEAD = struct.Struct(">IBIBI")  # a DATA frame's header and its message's prefix
HEADERS_WORD, TRAILERS_WORD = len(RESPONSE_HEADERS) << 8 | HEADERS, len(TRAILERS_OK) << 8 | HEADERS


ACCEPT_ENCODING = literal(b"grpc-accept-encoding", b"identity,deflate,gzip")  # the message codings inflated


def trailers(code: int, message: str) -> bytes:
    """A call's status; an UNIMPLEMENTED one says which message codings are accepted (gRPC's compression.md asks it
    of a refused coding)."""
    if code == OK and not message:
        return TRAILERS_OK
    block = literal(b"grpc-status", str(code).encode())
    if code == UNIMPLEMENTED:
        block += ACCEPT_ENCODING
    return block + literal(b"grpc-message", percent_encoded(message)) if message else block


def prefixed(message: bytes) -> bytes:
    """A gRPC message with its 5-byte prefix (not compressed, length)."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def metadatum(name: bytes, value: bytes) -> tuple[str, str | bytes]:
    """One metadata entry as grpc.aio takes it: a ``-bin`` value base64-decoded to bytes (undecodable: kept as sent,
    so the forwarded call fails where the client's would), any other as text."""
    key = name.decode("latin-1")
    if key.endswith("-bin"):
        try:
            return key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
        except (binascii.Error, ValueError):
            return key, value
    return key, value.decode("latin-1")


_BAD_NAME = re.compile(rb"[\x00-\x20A-Z\x7f-\xff]")  # not in a field name (RFC 9113 8.2.1), after its first byte
_BAD_VALUE = re.compile(rb"[\x00\r\n]|^[ \t]|[ \t]$")  # not in a field value (RFC 9113 8.2.1)


def malformed(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request's header fields are malformed (RFC 9113 8.1.1, 8.2, 8.3.1), or None."""
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if _BAD_NAME.search(name, 1) or not name:
            return "a field name with a space, a control or non-ASCII character" if name == name.lower() \
                else "an uppercase field name"
        if _BAD_VALUE.search(value):
            return f"field {name.decode('latin-1')[:40]!r}: a value with NUL, CR or LF, or leading or trailing space"
        if name.startswith(b":"):
            if regular:
                return "a pseudo-header after a regular field"
            if name not in REQUEST_PSEUDO or name in seen:
                return f"pseudo-header {name.decode('latin-1')!r} unknown or repeated"
            seen.add(name)
        else:
            regular = True
            if name in CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
                return f"connection-specific field {name.decode('latin-1')!r}"
    if not {b":method", b":scheme", b":path"} <= seen:
        return "a missing :method, :scheme or :path"
    return None


def timeout_s(value: bytes) -> float | None:
    """``grpc-timeout`` (up to 8 digits and a unit) in seconds; None when absent or malformed, as grpc-core takes a
    value it cannot parse (more digits too: ``int`` refuses thousands, ``float`` overflows on hundreds)."""
    if not 2 <= len(value) <= 9 or value[-1] not in TIMEOUT_UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * TIMEOUT_UNITS[value[-1]]
