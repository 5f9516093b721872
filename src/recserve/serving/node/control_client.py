"""Python client of the node server's control API (used by the online resource manager).

Only the standard library is used so that a policy process can import it cheaply::

    c = ControlClient("127.0.0.1", http_port)
    c.get_model("rmc1")["stages"]["model"]["workers"]
    c.set_workers("rmc1", 3, cores=[[0], [1], [1]])
    c.set_sub_batch("rmc1", 64)
    c.set_llc_ways("rmc1", 4)          # raises LlcUnsupportedError where the host has no resctrl
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.request
from typing import Any

from recserve.errors import RecserveError


class ControlError(RecserveError):
    """The server refused a control request; ``status`` is the HTTP status, ``field`` the bad field."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.field = field


class LlcUnsupportedError(ControlError):
    """The node cannot partition its LLC (HTTP 501)."""


class NodeUnreachableError(RecserveError, OSError):
    """No answer from the node (refused, reset, unknown host, timed out); still an ``OSError`` for callers that
    wait for a node to come up."""


class ControlClient:
    def __init__(self, host: str = "127.0.0.1", port: int = 8000, timeout_s: float = 180.0,
                 token: str | None = None) -> None:
        self.base = f"http://{host}:{port}"
        self.timeout_s = timeout_s
        self.token = token if token is not None else os.environ.get("RECSERVE_CONTROL_TOKEN")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                answer = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read() or b"{}")
            except ValueError:
                detail = {}
            message = detail.get("error", exc.reason)
            if exc.code == 401 and not self.token:
                message += " (this client sends the token in RECSERVE_CONTROL_TOKEN: set it to the node's)"
            cls = LlcUnsupportedError if exc.code == 501 else ControlError
            raise cls(exc.code, message, detail.get("field")) from None
        except (OSError, http.client.HTTPException) as exc:  # URLError, a reset, a timeout, not HTTP
            reason = getattr(exc, "reason", None) or exc
            raise NodeUnreachableError(f"cannot reach a node at {self.base} ({reason}); is `recserve serve` "
                                       "running there?") from None
        try:
            return json.loads(answer or b"{}")
        except ValueError:
            raise RecserveError(f"{self.base}{path} answered {len(answer)} bytes that are not JSON; is it a recserve "
                                "node?") from None

    def models(self) -> list[dict[str, Any]]:
        return self._request("GET", "/control/models")["models"]

    def get_model(self, model: str) -> dict[str, Any]:
        """Workers per stage (pids, cores, threads, RSS/PSS MB), sub_batch, queue, llc_ways."""
        return self._request("GET", f"/control/models/{model}")

    def set_workers(self, model: str, n: int, cores: list[Any] | None = None, threads: int | None = None,
                    stage: str | None = None, replace: bool = False) -> dict[str, Any]:
        """Resize (and optionally re-pin) a model's workers (``replace``: every one by a fresh worker); returns once
        old workers have retired."""
        body: dict[str, Any] = {"workers": n, "cores": cores, "threads": threads, "stage": stage, "replace": replace}
        return self._request("POST", f"/control/models/{model}/workers", body)

    def set_sub_batch(self, model: str, k: int) -> dict[str, Any]:
        return self._request("POST", f"/control/models/{model}/sub_batch", {"sub_batch": k})

    def set_min_items(self, model: str, k: int) -> dict[str, Any]:
        """Queries of >= ``k`` items go to the model's accelerator workers."""
        return self._request("POST", f"/control/models/{model}/accelerator", {"min_items": k})

    def set_llc_ways(self, model: str, ways: int) -> dict[str, Any]:
        return self._request("POST", f"/control/models/{model}/llc", {"ways": ways})

    def node(self) -> dict[str, Any]:
        """Usable cores and LLC partitioning support (``llc.supported``, ``llc.total_ways``)."""
        return self._request("GET", "/control/node")

    def window_stats(self, model: str, seconds: float = 10.0, percentile: float | None = None) -> dict[str, Any]:
        """``tail_ms`` (at the model's SLA percentile unless given), ``qps``, ``arrival_qps`` over the window."""
        query = f"?seconds={seconds}" + (f"&percentile={percentile}" if percentile is not None else "")
        return self._request("GET", f"/control/models/{model}/window{query}")

    # ---- model repository (Triton's extension) ----
    @classmethod
    def from_url(cls, url: str, timeout_s: float = 180.0) -> ControlClient:
        """``http://host:port`` or ``host:port``."""
        address = url.split("://", 1)[-1].rstrip("/")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise RecserveError(f"server URL must look like http://HOST:PORT, got {url!r}")
        return cls(host, int(port), timeout_s)

    def repository_index(self, ready: bool = False) -> list[dict[str, str]]:
        return self._request("POST", "/v2/repository/index", {"ready": ready})  # type: ignore[return-value]

    def load_model(self, model: str) -> None:
        """Load (or reload: a new version swaps in) a repository model; returns once it serves."""
        self._request("POST", f"/v2/repository/models/{model}/load", {})

    def unload_model(self, model: str) -> None:
        self._request("POST", f"/v2/repository/models/{model}/unload", {})

    # ---- system shared memory (Triton's extension) ----
    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        """Register ``byte_size`` bytes at ``offset`` of the POSIX shared-memory object ``key`` as region ``name``."""
        self._request("POST", f"/v2/systemsharedmemory/region/{name}/register",
                      {"key": key, "offset": offset, "byte_size": byte_size})

    def unregister_system_shared_memory(self, name: str = "") -> None:
        """Unregister region ``name`` (every region when empty)."""
        self._request("POST", f"/v2/systemsharedmemory{f'/region/{name}' if name else ''}/unregister")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", timeout=self.timeout_s) as resp:
            return resp.read().decode()
