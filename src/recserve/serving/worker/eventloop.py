"""The event loop a serving worker runs: uvloop where it works on this host, asyncio's own otherwise.

Why (docs/decisions/2026-11-28-uvloop.md): at batch 1 a worker spends about as much CPU around the model as in it, and
asyncio's selector loop is a fixed share of that, several times uvloop's per request.  uvloop is native code, so it is
probed once per node in a child process (as io_uring is, ``embedding/uring.py``): a wheel that fails to import, or kills
its process on this CPU, only means asyncio.  The node config's ``event_loop`` (``auto``, ``uvloop``, ``asyncio``)
chooses; ``auto`` is uvloop when the probe passes.

The workers can run on either loop because a connection's descriptor is the worker's own and its transport holds
a duplicate (``http_connection.Connection.sock``): uvloop closes a transport's descriptor before ``connection_lost``,
and the number must stay that connection's until the supervisor is told it is gone.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any

from recserve.hostinfo import probe_in_child

EVENT_LOOPS = ("auto", "uvloop", "asyncio")
PROBE_TIMEOUT_S = 20.0
# a loop that serves one TCP echo: import alone would miss an illegal instruction in the loop's own code paths
PROBE_CODE = """
import asyncio, socket, uvloop

async def main():
    async def echo(reader, writer):
        writer.write(await reader.read(5))
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"hello")
    assert await reader.read(5) == b"hello"
    writer.close()
    server.close()

uvloop.run(main())
print("ok")
"""


@functools.cache
def probe_uvloop() -> tuple[bool, str]:
    """Whether uvloop serves a TCP echo in a child process of this interpreter, and why not."""
    return probe_in_child(PROBE_CODE, "the uvloop probe", PROBE_TIMEOUT_S)


def choose(setting: str) -> tuple[str, str]:
    """The loop workers run for the node config's ``event_loop`` setting, and why when it is not the one asked."""
    if setting == "asyncio":
        return "asyncio", ""
    ok, why = probe_uvloop()
    if ok:
        return "uvloop", ""
    return "asyncio", f"uvloop unavailable ({why})"


def run(main: Coroutine[Any, Any, Any], loop: str) -> Any:
    """``asyncio.run(main)`` on the chosen loop (asyncio's own if uvloop cannot be imported after all)."""
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)
