"""The server process's own listener on the node's socket, closed while connections arrive: each connection it
accepted is answered (503: the node is stopping) or closed, never left open and unanswered.  asyncio builds an
accepted socket's transport a loop turn after the accept; closing the listener in that turn used to lose it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from recserve.serving.node.handover import OwnAccepts
from tests.support.nodes import node_config

REQUEST = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"


def _outcome(client: socket.socket) -> str:
    """``answered <status>``, ``closed`` (EOF or reset without an answer) or ``hung`` (nothing in 20 s)."""
    client.settimeout(20)
    try:
        answer = client.recv(65536)
    except TimeoutError:
        return "hung"
    except OSError:
        return "closed"
    finally:
        client.close()
    return f"answered {answer.split()[1].decode()}" if answer else "closed"


async def _close_after(turns: int, how: str) -> str:
    """A client connects and sends while nothing accepts yet; the server process listens, lets the loop run
    ``turns`` times and stops listening (``how``); the client's outcome once the listening socket is gone."""
    own = OwnAccepts(node_config("hercules-rmc1"), lambda _: None)  # no aiohttp server: every connection hears 503
    with socket.create_server(("127.0.0.1", 0)) as listening:
        listening.setblocking(False)
        client = socket.create_connection(listening.getsockname(), timeout=20)
        client.sendall(REQUEST)
        outcome = asyncio.get_running_loop().run_in_executor(None, _outcome, client)
        own.listen(listening)
        for _ in range(turns):
            await asyncio.sleep(0)
        if how == "stop_listening":
            own.stop_listening()
        await own.close_listening()
        await own.refused_all()
    return await outcome  # a connection still in the listen queue was reset with the socket


@pytest.mark.parametrize("how", ["close_listening", "stop_listening"])
def test_every_connection_the_listener_took_before_it_closed_is_answered_or_closed(how):
    outcomes = []
    for turns in range(8):  # the accept lands in one of these turns: closing in the next one lost it
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            outcomes.append(runner.run(_close_after(turns, how)))
    assert set(outcomes) <= {"answered 503", "closed"}, outcomes
    assert "answered 503" in outcomes, outcomes  # some closes came after the accept
