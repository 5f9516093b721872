"""A stand-in for an asyncio transport under an HTTP/2 connection, for sans-IO tests of serving/transport/h2grpc.py."""

from __future__ import annotations


class Transport:
    """Records what the connection writes; reading can be paused and resumed; closing is remembered."""

    def __init__(self) -> None:
        self.data, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.data += bytes(data)

    def close(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str) -> None:
        return None

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def frames(self, keep: bool = False) -> list[tuple[int, int, bytes]]:
        """(type, stream, payload) of each frame written since the last call (``keep``: and keep them)."""
        out, data = [], self.data
        if not keep:
            self.data = b""
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            out.append((data[3], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
            data = data[9 + length:]
        return out
