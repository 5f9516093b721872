"""HTTP/1.1 framing cases a server must refuse (RFC 9112: smuggling shapes and their neighbours), shared by the
workers' tests and the server process's."""

from __future__ import annotations

S = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"  # a request hidden where a parser may take it for a body
P = b"POST /v2/models/b/infer HTTP/1.1\r\n"
BIG = b"X-Big: " + b"a" * 70_000 + b"\r\n"

# the framing cases (and their neighbours): the whole message, and the status the head is refused with
FRAMING = {
    "cl_twice_differing": (P + b"Host: x\r\nContent-Length: 0\r\nContent-Length: %d\r\n\r\n" % len(S) + S, 400),
    "space_before_colon": (P + b"Host: x\r\nContent-Length : %d\r\n\r\n" % len(S) + S, 400),
    "obs_fold": (P + b"Host: x\r\nX-Foo: a\r\n Content-Length: %d\r\n\r\n" % len(S) + S, 400),
    "te_identity": (P + b"Host: x\r\nTransfer-Encoding: identity\r\n\r\n" + S, 501),
    "te_gzip": (P + b"Host: x\r\nTransfer-Encoding: gzip\r\n\r\n" + S, 501),
    "te_gzip_chunked": (P + b"Host: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    "te_and_cl": (P + b"Host: x\r\nTransfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n0\r\n\r\n" % len(S)
                  + S, 400),
    "te_in_http10": (b"POST /v2/models/b/infer HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    "cl_plus": (P + b"Host: x\r\nContent-Length: +%d\r\n\r\n" % len(S) + S, 400),
    "cl_underscore": (P + b"Host: x\r\nContent-Length: 1_0\r\n\r\n0123456789", 400),
    "bare_cr_in_value": (P + b"Host: x\r\nX-A: a\rContent-Length: 0\r\n\r\n" + S, 400),
    "nul_in_value": (P + b"Host: x\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n" + S, 400),
    "space_in_name": (P + b"Host: x\r\nContent Length: %d\r\n\r\n" % len(S) + S, 400),
    "no_host": (P + b"Content-Length: 0\r\n\r\n" + S, 400),
    "two_hosts": (P + b"Host: x\r\nHost: y\r\nContent-Length: 0\r\n\r\n" + S, 400),
    "head_70kb_at_once": (P + b"Host: x\r\n" + BIG + b"Content-Length: 0\r\n\r\n" + S, 431),
    "no_version": (b"GET /v2/health/ready\r\nHost: x\r\n\r\n", 400),  # HTTP/0.9: its answer would have no head
}
