"""Queries a worker's model failed (it raised, or its scores broke the contract), for the operator: logged at most
once every ``MODEL_FAILURE_LOG_S`` with how many failed since, never a line per query (``ModelFailures``)."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("recserve.serving")
MODEL_FAILURE_LOG_S = 10.0


class ModelFailures:
    """One worker's count of the queries its model failed, and when it last said so."""

    def __init__(self, model_name: str, version: str) -> None:
        self.model_name, self.version = model_name, version
        self.count, self.said = 0, -MODEL_FAILURE_LOG_S

    def failed(self, message: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.said >= MODEL_FAILURE_LOG_S:
            log.warning("model %s version %s: %d quer%s failed in the model since the last report; the latest: %s",
                        self.model_name, self.version, self.count, "y" if self.count == 1 else "ies",
                        message.split("\n", 1)[0][:500])
            self.count, self.said = 0, now
