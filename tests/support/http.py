"""HTTP requests of the tests to a server on loopback: every answer comes back as status, headers and body (a 4xx or
5xx is an answer to assert on, not an exception), and every request has a timeout, so a stuck server fails the test
instead of hanging it."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.serving.wire import codec

if TYPE_CHECKING:
    import tritonclient.http as thttp

TIMEOUT_S = 30.0
JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Message  # looked up case-insensitively, as HTTP names are
    body: bytes

    def json(self) -> Any:
        """The body as JSON; an empty body is ``None``."""
        return json.loads(self.body or b"null")

    def status_and_json(self) -> tuple[int, Any]:
        return self.status, self.json()

    def outputs(self) -> dict[str, np.ndarray]:
        """The output tensors of an infer answer, binary or plain JSON."""
        length = self.headers.get(codec.HEADER_LENGTH)
        return codec.decode_http_response(self.body, None if length is None else int(length))

    def scores(self) -> np.ndarray:
        return self.outputs()["scores"]


def triton(port: int, **options: Any) -> thttp.InferenceServerClient:
    """tritonclient's HTTP client of the node whose HTTP port is ``port``."""
    import tritonclient.http as thttp  # only where a test speaks as a user's client does

    return thttp.InferenceServerClient(f"127.0.0.1:{port}", **options)


def url(port: int, path: str = "", scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{port}{path}"


def request(target: int | str, path: str = "", *, method: str | None = None, body: bytes | None = None,
            headers: dict[str, str] | None = None, timeout_s: float = TIMEOUT_S,
            context: ssl.SSLContext | None = None) -> Reply:
    """One request to ``target`` (a port on 127.0.0.1, or a URL) plus ``path``; ``method`` defaults to POST with a
    body and GET without, as urllib's does."""
    address = url(target, path) if isinstance(target, int) else target + path
    req = urllib.request.Request(address, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as r:
            return Reply(r.status, r.headers, r.read())
    except urllib.error.HTTPError as err:
        with err:
            return Reply(err.code, err.headers, err.read())


def get(target: int | str, path: str = "", **options: Any) -> Reply:
    return request(target, path, **options)


def get_json(target: int | str, path: str = "", **options: Any) -> Any:
    """The JSON body of a GET that must succeed."""
    reply = get(target, path, **options)
    assert reply.status == 200, (path, reply.status, reply.body[:300])
    return reply.json()


def post(target: int | str, path: str = "", body: bytes = b"", headers: dict[str, str] | None = None,
         **options: Any) -> Reply:
    return request(target, path, method="POST", body=body, headers=headers, **options)


def post_json(target: int | str, path: str = "", document: Any = None, headers: dict[str, str] | None = None,
              **options: Any) -> Reply:
    """POST ``document`` as JSON (``None``: an empty object)."""
    body = json.dumps({} if document is None else document).encode()
    return post(target, path, body, headers={**JSON, **(headers or {})}, **options)


def json_infer_body(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """A plain-JSON infer request for ``arrays`` (name -> tensor): every number in the JSON."""
    return {"inputs": [{"name": name, "datatype": codec.DATATYPES[array.dtype], "shape": list(array.shape),
                        "data": array.reshape(-1).tolist()} for name, array in arrays.items()]}


def binary_infer_body(arrays: dict[str, np.ndarray], **encode: Any) -> tuple[bytes, dict[str, str]]:
    """A binary-extension infer request for ``arrays`` and the header that says where its JSON ends."""
    body, length = codec.encode_http_request(arrays, **encode)
    return body, {codec.HEADER_LENGTH: str(length)}


def infer(target: int | str, model: str, arrays: dict[str, np.ndarray], **options: Any) -> Reply:
    """A binary-extension infer request for ``arrays`` to ``model``, as tritonclient sends it."""
    body, headers = binary_infer_body(arrays)
    return post(target, f"/v2/models/{model}/infer", body, headers=headers, **options)
