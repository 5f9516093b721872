"""The same model as a Ray Serve deployment behind Ray's HTTP proxy (``num_replicas`` replicas)."""

from __future__ import annotations

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from benchmarks.peers.common import HEADER, infer, load_model


@serve.deployment
class RecModelDeployment:
    def __init__(self) -> None:
        self.model = load_model()

    async def __call__(self, request: Request) -> Response:
        body, headers = infer(self.model, await request.body(), request.headers.get(HEADER))
        return Response(content=body, headers=headers)
