"""What a model looks like from outside: enough to validate a query and describe the model without a worker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelInfo:
    """What the front end needs to validate a query without touching a worker."""

    dense_in: int
    rows: tuple[int, ...]
    seq_lens: dict[int, int]
    towers: int
    io_in_bytes: int = 0
    io_out_bytes: int = 0
