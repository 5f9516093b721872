"""A worker's SSD-tier counters (``embedding/tiered.py``'s ``TierStats`` over its model's tiered tables) sent to the
supervisor as ``("tier", ...)`` stats records, so ``/metrics`` shows what the planner predicted: hit rate, reads,
bytes read and rows that failed their checksum."""

from __future__ import annotations

from typing import Any

FIELDS = ("lookups", "hits", "misses", "ios", "bytes_read", "checksum_errors")


class TierCounts:
    """The tier counters of ``model`` since the last call, as a list of at most one stats record."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.sent = (0,) * len(FIELDS)

    def __call__(self) -> list[tuple]:
        from recserve.embedding.tiered import tier_stats

        stats = tier_stats(self.model)
        now = tuple(int(getattr(stats, f)) for f in FIELDS)
        delta = tuple(a - b for a, b in zip(now, self.sent, strict=True))
        if not any(delta):
            return []
        self.sent = now
        return [("tier", *delta)]


def tier_counts(model: Any) -> TierCounts | None:
    """A counter for ``model``'s tiered tables; None when it has none (the beat then reads nothing)."""
    from recserve.embedding.tiered import TieredTable

    tables = getattr(model, "tables", ())
    return TierCounts(model) if any(isinstance(t, TieredTable) for t in tables) else None
