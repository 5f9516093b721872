"""The same model behind KServe's ModelServer (v2 / Open Inference Protocol, REST and gRPC).

    python -m benchmarks.peers.kserve_app --http_port P --grpc_port Q --workers N   (in the kserve venv)

Run by ``bench_peers.py`` in a venv of its own (``peers/venvs.py``).  ``--workers N`` gives N uvicorn processes for
REST; KServe serves gRPC from the main process alone (one model copy, whatever ``--workers`` says).  KServe binds
every interface; the benchmark's servers listen on loopback only, so both listeners are moved to 127.0.0.1 here.
"""

from __future__ import annotations

from types import SimpleNamespace

import grpc.aio
import kserve.protocol.grpc.server as kserve_grpc
import kserve.protocol.rest.server as kserve_rest
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.utils.utils import generate_uuid

from benchmarks.peers.common import OUTPUT, load_model, model_name, score

LOOPBACK = "127.0.0.1"


class RecPeer(Model):
    """One zoo model; ``predict`` runs on the server's event loop, as KServe runs a synchronous predict."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model = load_model()
        self.ready = True

    def predict(self, payload: InferRequest, headers: dict | None = None) -> InferResponse:
        scores = score(self.model, {t.name: t.as_numpy() for t in payload.inputs})
        output = InferOutput(OUTPUT, list(scores.shape), "FP32", data=scores)
        return InferResponse(payload.id or generate_uuid(), self.name, [output],
                             requested_outputs=payload.request_outputs)


def _loopback_grpc_server(*args, **kwargs) -> grpc.aio.Server:
    server = grpc.aio.server(*args, **kwargs)
    add = server.add_insecure_port
    server.add_insecure_port = lambda address: add(address.replace("[::]", LOOPBACK))
    return server


def bind_loopback() -> None:
    """KServe's REST config and gRPC listener, which name every interface, moved to 127.0.0.1."""
    rest_init = kserve_rest.RESTServer.__init__

    def loopback_rest_init(self, *args, **kwargs) -> None:
        rest_init(self, *args, **kwargs)
        self.config.host = LOOPBACK  # read when uvicorn binds (one process, or the parent of several)

    kserve_rest.RESTServer.__init__ = loopback_rest_init
    kserve_grpc.aio = SimpleNamespace(server=_loopback_grpc_server)


if __name__ == "__main__":
    bind_loopback()
    ModelServer().start([RecPeer(model_name())])
