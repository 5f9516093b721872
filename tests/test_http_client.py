"""The load generator's lean HTTP client: keep-alive reuse, Content-Length and chunked bodies, closes, timeouts."""

from __future__ import annotations

import asyncio

import pytest

from recserve.measure.http_client import HttpClientError, HttpPool, encode_post
from tests.support.ports import free_port


async def serve(port: int, answers: list[bytes], accepted: list[int]) -> asyncio.AbstractServer:
    """Answers each request (one read of a whole small request) with the next canned answer; b"" = close."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        while answers:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed the connection
                return
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            answer = answers.pop(0)
            if answer == b"hang":
                await asyncio.sleep(5)
                return
            if not answer:
                writer.close()
                return
            writer.write(answer)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


def test_keep_alive_chunked_close_and_timeout():
    async def run() -> None:
        port = free_port()
        answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
                   b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nbus\r\n1;x=y\r\ny\r\n"
                   b"0\r\n\r\n",
                   b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                   b"",  # the server drops the next connection's request
                   b"hang"]
        accepted: list[int] = []
        server = await serve(port, answers, accepted)
        pool = HttpPool("127.0.0.1", port, limit=4)
        request = encode_post("x", "/v2/models/m/infer", b"body", {"X-A": "1"})
        try:
            first = await pool.send(request, 5.0)
            assert (first.status, first.body) == (200, b"hello")
            second = await pool.send(request, 5.0)  # the same connection, kept alive
            assert (second.status, second.body, len(accepted)) == (503, b"busy", 1)
            third = await pool.send(request, 5.0)  # answered with Connection: close: not reused
            assert third.body == b"ok"
            with pytest.raises(HttpClientError, match="closed"):
                await pool.send(request, 5.0)
            with pytest.raises(TimeoutError):
                await pool.send(request, 0.2)
            assert len(accepted) == 3
        finally:
            pool.close()
            server.close()
        with pytest.raises(HttpClientError, match="cannot connect"):
            await HttpPool("127.0.0.1", free_port()).send(request, 1.0)

    asyncio.run(run())


def test_a_malformed_response_is_an_error():
    async def run() -> None:
        port = free_port()
        server = await serve(port, [b"SMTP ready\r\n\r\n"], [])
        try:
            with pytest.raises(HttpClientError, match="not an HTTP"):
                await HttpPool("127.0.0.1", port).send(encode_post("x", "/", b"", {}), 5.0)
        finally:
            server.close()

    asyncio.run(run())


def test_an_endpoint_url_gives_host_port_tls_and_route_prefix():
    from recserve.measure.http_client import Endpoint

    assert Endpoint.parse("http://127.0.0.1:8000") == Endpoint("127.0.0.1", 8000, False, "")
    assert Endpoint.parse("https://node.example/app/") == Endpoint("node.example", 443, True, "/app")
    assert Endpoint.parse("http://[::1]:9000/a/b") == Endpoint("::1", 9000, False, "/a/b")
    assert Endpoint.parse("http://h") == Endpoint("h", 80, False, "")
    for bad in ("127.0.0.1:8000", "ftp://h:1", "http://:80"):
        with pytest.raises(ValueError, match="http"):
            Endpoint.parse(bad)


def test_an_http_1_0_answer_closes_its_connection_and_a_stale_kept_alive_one_is_retried_when_asked():
    async def run() -> None:
        port = free_port()
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        # an HTTP/1.0 answer without keep-alive: the next request must not go down that connection
        answers = [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nv0", ok]
        accepted: list[int] = []
        server = await serve(port, answers, accepted)
        pool = HttpPool("127.0.0.1", port)
        request = encode_post("x", "/", b"q", {})
        try:
            assert (await pool.send(request, 5.0)).body == b"v0"
            assert (await pool.send(request, 5.0)).body == b"ok"
            assert len(accepted) == 2
        finally:
            pool.close()
            server.close()

        for retry, expected in ((True, b"ok"), (False, HttpClientError)):
            port = free_port()
            # the kept-alive connection closes as the second request arrives (an idle timeout's race)
            answers, accepted = [ok, b"", ok], []
            server = await serve(port, answers, accepted)
            pool = HttpPool("127.0.0.1", port, retry_stale=retry)
            try:
                assert (await pool.send(request, 5.0)).body == b"ok"
                if expected is HttpClientError:
                    with pytest.raises(HttpClientError, match="closed"):
                        await pool.send(request, 5.0)
                else:
                    assert (await pool.send(request, 5.0)).body == expected
                    assert len(accepted) == 2
            finally:
                pool.close()
                server.close()

        port = free_port()
        server = await serve(port, [b""], [])  # a new connection that closes: no retry, whatever retry_stale says
        try:
            with pytest.raises(HttpClientError, match="closed"):
                await HttpPool("127.0.0.1", port, retry_stale=True).send(request, 5.0)
        finally:
            server.close()

    asyncio.run(run())


@pytest.mark.parametrize("answer", [b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nhello",
                                    b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\nhello",
                                    b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
                                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\nab\r\n0\r\n\r\n"])
def test_a_body_length_that_is_not_a_plain_number_is_an_error_at_once(answer):
    async def run() -> None:
        port = free_port()
        server = await serve(port, [answer], [])
        try:
            with pytest.raises(HttpClientError, match="malformed"):  # not a wait for the timeout
                await HttpPool("127.0.0.1", port).send(encode_post("x", "/", b"", {}), 30.0)
        finally:
            server.close()

    asyncio.run(asyncio.wait_for(run(), 20))
