"""Detect the machine recserve runs on, as a ServerType named ``this-host``.

Memory bandwidth cannot be read from sysfs; it is an assumption until ``recserve profile`` measures it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")

ASSUMED_MEM_BW_GBS = 20.0
ASSUMED_BASE_POWER_W = 60.0
ASSUMED_POWER_PER_CORE_W = 8.0
"""Power cannot be read either (RAPL is rarely exposed to users): a stated estimate, so planners can run."""


def signal_name(returncode: int) -> str | None:
    """The signal that stopped a child process (``returncode`` < 0: ``SIGKILL``, ``SIGILL``...); None if it exited."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def how_it_ended(returncode: int | None) -> str:
    """A child process's end in words, the one wording every message uses: ``killed by SIGKILL (signal 9)``,
    ``exited with code 1``, ``exit status unknown`` (None: not reaped)."""
    if returncode is None:
        return "exit status unknown"
    if returncode >= 0:
        return f"exited with code {returncode}"
    name = signal_name(returncode)
    return f"killed by {name}" if name == f"signal {-returncode}" else f"killed by {name} (signal {-returncode})"


def log_tail(path: Path, lines: int = 1, max_bytes: int = 4096) -> list[str]:
    """The last ``lines`` non-empty lines of a process's log (its last ``max_bytes`` read), stripped; none where
    the file is missing."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - max_bytes))
            text = log.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()][-lines:]


def probe_in_child(code: str, what: str, timeout_s: float, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Run ``code`` in a child interpreter; ``(True, "")`` if it exits 0 having printed ``ok``, else ``(False,
    why)`` naming ``what``.  Native code (io_uring through ctypes, uvloop's wheel) may die on this CPU or kernel
    (SIGILL, a seccomp kill): in a child that only means "unavailable", never the caller's death."""
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"{what} did not finish in {timeout_s:.0f} s"
    except OSError as exc:
        return False, f"{what} could not start: {exc}"
    if (name := signal_name(proc.returncode)) is not None:
        return False, f"{what} process was killed by {name}"
    if proc.returncode != 0 or proc.stdout.strip() != "ok":
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return False, f"{what} failed: {lines[-1] if lines else f'exit {proc.returncode}'}"
    return True, ""


def _llc() -> tuple[float, int]:
    """LLC size (MB) and associativity (ways) of the highest cache level sysfs reports."""
    best: tuple[int, float, int] = (0, 0.0, 0)
    for index in sorted(_CACHE.glob("index*")):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
            ways = int((index / "ways_of_associativity").read_text())
        except (OSError, ValueError):
            continue
        kb = float(size.rstrip("KMG")) * {"K": 1, "M": 1024, "G": 1024**2}.get(size[-1], 1 / 1024)
        if level >= best[0]:
            best = (level, kb / 1024, ways)
    return best[1], best[2]


def memory_mb() -> float | None:
    """This host's physical memory in MiB (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, AttributeError):
        return None


def resctrl_available() -> bool:
    """Whether Intel CAT / AMD L3 QoS is mounted, so LLC ways can be assigned per model."""
    return Path("/sys/fs/resctrl/schemata").exists()


def this_host() -> dict[str, Any]:
    """This host's ServerType fields (``specs`` builds the ServerType: host facts sit below the spec layer)."""
    llc_mb, ways = _llc()
    cores = len(os.sched_getaffinity(0))
    power_w = ASSUMED_BASE_POWER_W + ASSUMED_POWER_PER_CORE_W * cores
    return dict(
        name="this-host",
        cores=cores,
        mem_gb=round((memory_mb() or 1024.0) / 1024, 1),
        mem_bw_gbs=ASSUMED_MEM_BW_GBS,
        llc_mb=llc_mb,
        llc_ways=ways,
        power_w=power_w,
        source="detected at run time from sysfs and /proc",
        assumptions=(
            f"mem_bw_gbs={ASSUMED_MEM_BW_GBS} until measured by `recserve profile`",
            f"power_w={power_w:g} assumed ({ASSUMED_BASE_POWER_W:g} W + {ASSUMED_POWER_PER_CORE_W:g} W per core; "
            "not measured): watts on this host rank configurations, they are not a power reading",
            "LLC way partitioning available"
            if resctrl_available()
            else "no /sys/fs/resctrl: LLC ways not partitionable",
        ),
    )


_PRIVATE = re.compile(r"recserve-[a-z]+-")  # a private folder's name: its kind, then mkdtemp's random part
OWNER = ".owner"  # in a private folder: the pid of the process that made it


def private_folder(kind: str) -> str:
    """A new private temporary folder of this process (``recserve-<kind>-XXXXXXXX``, as short as Unix socket paths
    need) for its sockets or shared files, its pid in ``.owner`` so that a later process can remove it if this one
    is killed before it could (``remove_orphaned``)."""
    folder = tempfile.mkdtemp(prefix=f"recserve-{kind}-")
    with open(os.path.join(folder, OWNER), "w") as owner:
        owner.write(str(os.getpid()))
    return folder


def remove_orphaned(directory: str | None = None) -> list[str]:
    """Remove the private folders (``private_folder``) of this user's processes that are gone (killed before they
    could remove their own); those of live processes, and folders without an owner, are never touched.  The folders
    removed."""
    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not _PRIVATE.match(entry.name):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            with open(os.path.join(entry.path, OWNER)) as owner:
                pid = int(owner.read(16))
        except (OSError, ValueError):
            continue
        if not _alive(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: alive
        return True
    return True
