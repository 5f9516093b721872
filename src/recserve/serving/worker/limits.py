"""What bounds a whole-query worker (``worker/plane.py``): its queue, its connections, body sizes, fused passes."""

from __future__ import annotations

from dataclasses import dataclass

from recserve.serving.transport.h2limits import FloodLimits
from recserve.serving.wire.codec import MAX_JSON_BYTES


@dataclass
class PlaneLimits:
    """What bounds a worker's queue: count, time, body size, fused pass size and slow clients."""

    max_body: int = 64 * 1024 * 1024
    max_json: int = MAX_JSON_BYTES  # the JSON part of a request (decoding blocks the worker's loop)
    queue_limit: int = 64  # this worker's share of the model's; the bound where no model-wide view is given
    model_queue_limit: int = 0  # queries the model's workers together hold at most (0: only ``queue_limit``)
    deadline_s: float = 1.0  # per-query deadline when the client sets no ``timeout``
    fuse_items: int = 256  # largest fused forward pass in samples; 0 = one query per pass
    read_timeout_s: float = 30.0  # a request must arrive whole within this
    keep_alive_s: float = 300.0  # a connection with no request in progress this long is closed
    max_connections: int = 4096  # past it a new connection is answered 503 and closed (HTTP), GOAWAY (gRPC)
    flood: FloodLimits = FloodLimits()  # HTTP/2 frames that carry no request, per connection
    compute_thread_ms: float = 2.0  # passes predicted at least this long run off the loop; < 0: never
