"""The same model as a Seldon MLServer custom runtime (v2 / Open Inference Protocol, REST and gRPC).

Run by ``bench_peers.py`` in a venv of its own (``peers/venvs.py``) as ``mlserver start <folder>``, where
``<folder>/<model>/model-settings.json`` is a copy of ``mlserver-model-settings.json`` beside this file (MLServer
names a model after its folder); the server's settings (loopback, ports, ``parallel_workers``: the number of
inference processes, each with its own model copy, behind one front-end process) come from ``MLSERVER_*`` variables.
"""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from benchmarks.peers.common import OUTPUT, load_model, score


class RecPeer(MLModel):
    """One zoo model; ``predict`` runs in an inference worker's event loop."""

    async def load(self) -> bool:
        self.model = load_model()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        scores = score(self.model, {t.name: NumpyCodec.decode_input(t) for t in payload.inputs})
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output(OUTPUT, scores)])
