"""A plain FastAPI + PyTorch server: ``uvicorn benchmarks.peers.fastapi_app:app --workers 2``.

Each uvicorn worker process holds its own copy of the model and runs inference in the request
handler (the usual way such servers are written), answering the same v2 infer requests.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, Response

from benchmarks.peers.common import HEADER, infer, load_model

app = FastAPI()
MODEL = load_model()


@app.post("/v2/models/{name}/infer")
async def infer_route(name: str, request: Request) -> Response:
    body, headers = infer(MODEL, await request.body(), request.headers.get(HEADER))
    return Response(content=body, headers=headers)


@app.get("/v2/health/ready")
def ready() -> dict[str, bool]:
    return {"ready": True}
