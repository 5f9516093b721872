"""A router's HTTP front door held to the node's limits: aiohttp with the node server process's options (idle and
head limits, bodies decoded by ``node/http_bodies.py``, errors in JSON), its connection cap (503 + Retry-After),
503 to connections taken while stopping, and a stop bounded by ``STOP_GRACE_S`` rather than aiohttp's 60 s."""

from __future__ import annotations

import asyncio

from aiohttp import web

from recserve.serving.node.config import NodeConfig
from recserve.serving.node.handover import OwnAccepts

LIMITS = NodeConfig.model_construct()  # the node's defaults: read and idle timeouts, head, body and connection limits
STOP_GRACE_S = 5.0  # queries in flight at a stop get this long to be answered


class FrontDoor:
    """Serve ``app`` on ``host:port`` (``start``), until ``stop``."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.accepts = OwnAccepts(LIMITS, lambda _reason: None)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=STOP_GRACE_S, **self.accepts.options)
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        """Listen; the port listened on (``port`` 0: a free one)."""
        await self.runner.setup()
        self.accepts.server = self.runner.server
        try:
            self._server = await asyncio.get_running_loop().create_server(self.accepts.protocol, self.host,
                                                                          self.port)
        except BaseException:
            await self.runner.cleanup()  # the routers' client sessions, opened at setup, are closed too
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop listening; answer what is in flight within ``STOP_GRACE_S``; close the rest."""
        self.accepts.server = None
        if self._server is not None:
            self._server.close()
        await self.runner.cleanup()
