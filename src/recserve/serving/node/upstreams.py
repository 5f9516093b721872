"""The services a model's workers call for part of every query (ElasticRec's embedding shards: the model's
``options.endpoints``, group name -> replica addresses), watched from the server process for its readiness.

A query needs one reachable replica of every group (a worker's call fails over to another replica of the group,
``shards/remote_table.py``), so the model is ready while every group has one and not while a group has none (its
queries would fail: a shard's only replica restarting).  Each replica is watched through a gRPC channel's
connectivity, which gRPC keeps trying to connect (every second at most while the replica is down); a replica
counts as reachable while its channel is READY.  A channel whose connection was lost goes IDLE and stays there
until asked to connect: ``poke`` (each watchdog tick) asks."""

from __future__ import annotations

import functools
import threading
from typing import Any

import grpc

RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1000)]


class Upstreams:
    """Connectivity of every replica of every group; ``missing()`` names the groups with none reachable."""

    def __init__(self, endpoints: dict[str, list[str]]) -> None:
        self.groups = {name: list(addresses) for name, addresses in endpoints.items()}
        self._ready: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[Any, Any]] = {}
        self._connecting: dict[str, Any] = {}  # address -> the future of a connection asked for by ``poke``
        for address in {a for addresses in self.groups.values() for a in addresses}:
            channel = grpc.insecure_channel(address, options=RECONNECT_OPTIONS)
            seen = functools.partial(self._seen, address)
            channel.subscribe(seen, try_to_connect=True)
            self._channels[address] = channel, seen

    @classmethod
    def of(cls, options: dict[str, Any] | None) -> Upstreams | None:
        endpoints = (options or {}).get("endpoints")
        return cls(endpoints) if endpoints else None

    def _seen(self, address: str, state: grpc.ChannelConnectivity) -> None:  # gRPC's connectivity thread
        with self._lock:
            self._ready[address] = state == grpc.ChannelConnectivity.READY

    def reachable(self, address: str) -> bool:
        with self._lock:
            return self._ready.get(address, False)

    def missing(self) -> list[str]:
        """The groups none of whose replicas is reachable now."""
        return [name for name, addresses in self.groups.items() if not any(self.reachable(a) for a in addresses)]

    def poke(self) -> None:
        """Every replica not reachable is asked to connect (one request at a time per replica)."""
        for address, (channel, _) in self._channels.items():
            if not self.reachable(address) and address not in self._connecting:
                future = self._connecting[address] = grpc.channel_ready_future(channel)
                future.add_done_callback(lambda _f, a=address: self._connecting.pop(a, None))

    def close(self) -> None:
        for future in list(self._connecting.values()):
            future.cancel()
        for channel, seen in self._channels.values():
            channel.unsubscribe(seen)
            channel.close()
        self._channels = {}
