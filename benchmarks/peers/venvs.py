"""Virtual environments of the peers whose pins clash with recserve's (KServe, MLServer).

Each peer gets its own venv under a cache folder (default ``.peers-venv/<name>`` in the checkout, gitignored),
made on first use with pinned versions and the CPU torch wheel; a stamp file holds the requirements it was made
with, so a changed pin remakes it.  The peer apps import the model builder from recserve's sources (``src`` on
``PYTHONPATH``: ``recserve.specs`` and ``recserve.zoo`` need only torch, numpy and pyyaml), not an installed recserve.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RECSERVE_PEERS_VENV", ROOT / ".peers-venv"))
TORCH = "torch==2.13.0"  # the CPU wheel on this host's disk; an unpinned torch would fetch a CUDA build

# what each peer's venv holds beside torch; pyyaml for recserve's model catalogue
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "kserve": ("kserve==0.21.0", "pyyaml>=6"),
    # uvloop 0.22 raises in get_event_loop() without a running loop, which MLServer 1.7's inference workers call
    "mlserver": ("mlserver==1.7.1", "uvloop==0.21.0", "pyyaml>=6"),
}


@dataclass(frozen=True)
class PeerVenv:
    """One peer's venv: where it lies, what it holds, the commands that make it."""

    name: str
    requirements: tuple[str, ...]
    root: Path = CACHE

    @classmethod
    def of(cls, name: str, root: Path | None = None) -> PeerVenv:
        return cls(name, (TORCH, *REQUIREMENTS[name]), root or CACHE)

    @property
    def path(self) -> Path:
        return self.root / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.path / "recserve-requirements.txt"

    def stamp_text(self) -> str:
        return "\n".join(self.requirements) + "\n"

    def ready(self) -> bool:
        """Made, and with the requirements asked for now."""
        return self.python.exists() and self.stamp.exists() and self.stamp.read_text() == self.stamp_text()

    def commands(self) -> list[list[str]]:
        """Make the venv, then install every requirement in one resolve (torch pinned among them)."""
        return [[sys.executable, "-m", "venv", "--clear", str(self.path)],
                [str(self.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 *self.requirements]]

    def ensure(self, log: Callable[[str], None] = print) -> Path:
        """The venv's python, made first if it is missing or stale; a failed install leaves no stamp."""
        if self.ready():
            return self.python
        log(f"making the {self.name} venv at {self.path} ({' '.join(self.requirements)}): takes minutes")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for cmd in self.commands():
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                shutil.rmtree(self.path, ignore_errors=True)
                raise RuntimeError(f"{self.name} venv: {' '.join(cmd[:4])} ... exited {done.returncode}:\n"
                                   f"{done.stderr[-2000:]}")
        self.stamp.write_text(self.stamp_text())
        return self.python


def peer_env(python: Path, model: str, scale: float) -> dict[str, str]:
    """A peer's environment: recserve's sources and the benchmark folder first on the path, the model named."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update({"RECSERVE_PEER_MODEL": model, "RECSERVE_PEER_SCALE": str(scale),
                "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": f"{python.parent}:{env.get('PATH', '')}"})
    return env
