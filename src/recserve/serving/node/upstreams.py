"""The services a model's workers call for part of every query (ElasticRec's embedding shards: the model's
``options.endpoints``, group name -> replica addresses), watched from the server process for its readiness.

A query needs one serving replica of every group (a worker's call fails over to another replica of the group,
``shards/remote_table.py``), so the model is ready while every group has one and not while a group has none (its
queries would fail: a shard's only replica restarting or hung).  A replica counts as serving while it answers the
Open Inference Protocol's ``ServerReady`` (gRPC: the shard services speak gRPC only) with ready within
``PROBE_TIMEOUT_S``: a TCP connection alone is not enough, since the kernel completes handshakes for a stopped
(SIGSTOP) or deadlocked process.  Probes run from the watchdog tick (``poke``), never from the query path, at most
one in flight per replica (a hung one holds its probe until the deadline, not a pile of them), one started every
``PROBE_EVERY_S`` at most."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import grpc

from recserve.serving.wire.proto import service_pb2, service_pb2_grpc

RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1000)]
PROBE_TIMEOUT_S = 1.0  # a replica that does not answer ServerReady this soon is not serving
PROBE_EVERY_S = 0.5  # a replica is asked again this long after the last probe started, once that one is answered


class Upstreams:
    """Whether every replica of every group answers ServerReady; ``missing()`` names the groups with none that does."""

    def __init__(self, endpoints: dict[str, list[str]], probe_timeout_s: float = PROBE_TIMEOUT_S,
                 probe_every_s: float = PROBE_EVERY_S) -> None:
        self.groups = {name: list(addresses) for name, addresses in endpoints.items()}
        self.probe_timeout_s, self.probe_every_s = probe_timeout_s, probe_every_s
        self._ready: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[Any, Any]] = {}  # address -> (channel, its ServerReady method)
        self._probes: dict[str, Any] = {}  # address -> the ServerReady call in flight
        self._probed_at: dict[str, float] = {}  # address -> when its last probe started (monotonic)
        for address in {a for addresses in self.groups.values() for a in addresses}:
            channel = grpc.insecure_channel(address, options=RECONNECT_OPTIONS)
            self._channels[address] = channel, service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerReady
        self.poke()

    @classmethod
    def of(cls, options: dict[str, Any] | None) -> Upstreams | None:
        endpoints = (options or {}).get("endpoints")
        return cls(endpoints) if endpoints else None

    def reachable(self, address: str) -> bool:
        """Whether the replica's last answered probe said ready (False before its first answer)."""
        with self._lock:
            return self._ready.get(address, False)

    def missing(self) -> list[str]:
        """The groups none of whose replicas is serving now."""
        return [name for name, addresses in self.groups.items() if not any(self.reachable(a) for a in addresses)]

    def in_flight(self) -> int:
        with self._lock:
            return len(self._probes)

    def poke(self) -> None:
        """Probe every replica whose last probe is answered and started ``probe_every_s`` ago or more."""
        now = time.monotonic()
        for address, (_, server_ready) in self._channels.items():
            with self._lock:
                if address in self._probes or now - self._probed_at.get(address, -1e9) < self.probe_every_s:
                    continue
                self._probed_at[address] = now
                call = self._probes[address] = server_ready.future(service_pb2.ServerReadyRequest(),
                                                                    timeout=self.probe_timeout_s)
            call.add_done_callback(functools.partial(self._answered, address))  # may run at once, in this thread

    def _answered(self, address: str, call: Any) -> None:  # gRPC's thread
        try:
            ready = bool(call.result().ready)
        except (grpc.RpcError, grpc.FutureCancelledError):
            ready = False
        with self._lock:
            self._ready[address] = ready
            self._probes.pop(address, None)

    def close(self) -> None:
        with self._lock:
            probes, channels, self._channels = list(self._probes.values()), self._channels, {}
        for call in probes:
            call.cancel()
        for channel, _ in channels.values():
            channel.close()
