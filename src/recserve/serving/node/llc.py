"""LLC way partitioning per model with Intel CAT through the Linux resctrl filesystem.

Each served model gets a resctrl group ``recserve-<model>`` whose L3 schemata is a contiguous mask
of ``ways`` bits; masks of different models are laid out side by side (Hera's way partitioning)
and wrap around when the node is over-committed.  Worker pids are written to the group's
``tasks`` file when they start.  Without ``/sys/fs/resctrl`` (no CAT, or not mounted) every call
raises :class:`LlcUnsupported`, which the control API reports as HTTP 501.
"""

from __future__ import annotations

import re
from pathlib import Path

from recserve.errors import RecserveError

RESCTRL = Path("/sys/fs/resctrl")


class LlcUnsupported(RecserveError):
    """This host cannot partition its last-level cache."""


class LlcAllocator:
    def __init__(self, root: Path | str = RESCTRL) -> None:
        self.root = Path(root)
        self.ways: dict[str, int] = {}
        self.pids: dict[str, set[int]] = {}

    @property
    def supported(self) -> bool:
        return (self.root / "info" / "L3" / "cbm_mask").exists() and (self.root / "schemata").exists()

    def why_unsupported(self) -> str:
        if not self.root.exists():
            return f"LLC partitioning unsupported: {self.root} does not exist (no Intel CAT / resctrl not mounted)"
        return f"LLC partitioning unsupported: {self.root} has no L3 allocation (info/L3/cbm_mask missing)"

    def total_ways(self) -> int:
        mask = int((self.root / "info" / "L3" / "cbm_mask").read_text().strip(), 16)
        return bin(mask).count("1")

    def cache_ids(self) -> list[str]:
        for line in (self.root / "schemata").read_text().splitlines():
            line = line.strip()
            if line.startswith("L3:"):
                return [part.split("=")[0] for part in line[3:].split(";") if "=" in part]
        return ["0"]

    def group(self, model: str) -> Path:
        return self.root / ("recserve-" + re.sub(r"[^A-Za-z0-9_.-]", "_", model))

    def masks(self) -> dict[str, int]:
        """Contiguous, side-by-side way masks for every model with an allocation."""
        total = self.total_ways()
        out, offset = {}, 0
        for model, ways in self.ways.items():
            ways = min(ways, total)
            if offset + ways > total:
                offset = 0
            out[model] = ((1 << ways) - 1) << offset
            offset += ways
        return out

    def set_ways(self, model: str, ways: int, pids: list[int]) -> dict[str, object]:
        if not self.supported:
            raise LlcUnsupported(self.why_unsupported())
        total = self.total_ways()
        if not isinstance(ways, int) or not 1 <= ways <= total:
            raise ValueError(f"ways must be an integer in [1, {total}], got {ways!r}")
        self.ways[model] = ways
        self.pids.setdefault(model, set()).update(p for p in pids if p)
        for name, mask in self.masks().items():
            group = self.group(name)
            group.mkdir(exist_ok=True)
            line = "L3:" + ";".join(f"{cid}={mask:x}" for cid in self.cache_ids())
            (group / "schemata").write_text(line + "\n")
            for pid in sorted(self.pids.get(name, ())):
                self._write_pid(group, pid)
        return {"model": model, "ways": ways, "mask": f"{self.masks()[model]:x}", "group": str(self.group(model))}

    def _write_pid(self, group: Path, pid: int) -> None:
        try:
            with open(group / "tasks", "a") as f:
                f.write(f"{pid}\n")
        except ProcessLookupError:
            pass

    def add_pid(self, model: str, pid: int) -> None:
        """A new worker of ``model`` started: put it in the model's group if it has one."""
        self.pids.setdefault(model, set()).add(pid)
        if model in self.ways and self.supported:
            self._write_pid(self.group(model), pid)

    def forget_pid(self, model: str, pid: int) -> None:
        self.pids.get(model, set()).discard(pid)

    def ways_of(self, model: str) -> int | None:
        return self.ways.get(model)
