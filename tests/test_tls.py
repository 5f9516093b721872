"""TLS on the node's HTTP and gRPC ports (node config tls_cert / tls_key)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.error
import urllib.request

import grpc
import pytest
from tritonclient.grpc import service_pb2

from recserve.errors import SpecError
from recserve.serving.node.config import quick_config
from tests.support import grpc_client, http
from tests.support.nodes import node_config, started

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


def test_http_and_grpc_speak_tls(certificate):
    cert, key = certificate
    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.tls_cert, config.tls_key = cert, key  # set after construction: the server still uses one front end
    with started(config, drain=False) as server:
        ports = server.ports
        context = ssl.create_default_context(cafile=cert)
        reply = http.get(http.url(ports.http, "/v2/health/live", "https"), context=context)
        assert reply.status_and_json() == (200, {"live": True})
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            http.get(ports.http, "/v2/health/live", timeout_s=10)
        credentials = grpc.ssl_channel_credentials(root_certificates=open(cert, "rb").read())
        with grpc_client.stub(ports.grpc, credentials) as stub:
            assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live


def test_tls_config_needs_both_files_and_uses_one_front_end(certificate):
    cert, key = certificate
    config = quick_config("hercules-rmc1", scale=1e-4)
    with pytest.raises(SpecError, match="tls_cert and tls_key go together"):
        type(config)(models=config.models, tls_cert=cert)
    assert type(config)(models=config.models, tls_cert=cert, tls_key=key).front_end == "server"


def _bad_path_headers() -> bytes:
    """A HEADERS frame whose ``:path`` holds a byte that is not UTF-8 (a literal, never indexed)."""
    from recserve.serving.transport.h2frames import PREFACE
    from recserve.serving.transport.h2frames import frame as _frame

    def literal(name: bytes, value: bytes) -> bytes:
        return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value

    block = (b"\x83\x86" + literal(b":path", b"/inference.GRPCInferenceService/Server\xffLive")
             + literal(b":authority", b"x") + literal(b"content-type", b"application/grpc")
             + literal(b"te", b"trailers"))
    return PREFACE + _frame(4, 0, 0) + _frame(1, 5, 1, block)


@pytest.mark.parametrize("mode", ["workers", "server", "tls"])
def test_a_non_utf8_path_leaves_every_mode_serving_grpc(certificate, mode):
    """grpc.aio (grpcio 1.85) stopped listening on such a frame; every mode now meets clients with h2grpc."""
    import socket

    cert, key = certificate
    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    if mode == "server":
        config.front_end = "server"
    if mode == "tls":
        config.tls_cert, config.tls_key = cert, key
    context = ssl.create_default_context(cafile=cert)
    context.set_alpn_protocols(["h2"])
    with started(config) as server:
        port = server.ports.grpc
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
                sock = context.wrap_socket(raw, server_hostname="localhost") if mode == "tls" else raw
                sock.sendall(_bad_path_headers())
                received = b""
                while b"grpc-status" not in received and (chunk := sock.recv(1 << 16)):
                    received += chunk  # the call's status, or the end of the connection
        credentials = grpc.ssl_channel_credentials(root_certificates=open(cert, "rb").read()) if mode == "tls" else None
        with grpc_client.stub(port, credentials) as stub:
            assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live
