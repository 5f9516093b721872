"""``recserve doctor``: what this host offers recserve, and why a fallback was taken.

Checks what decides how recserve runs here, each with its reason: the CPU's vector extensions (a native wheel
built for AVX-512 traps without them), the SSD-tier read path (O_DIRECT on a directory, io_uring probed in a
child process so that a crash cannot take this command down) and its row cache's key index (native, probed the
same way, or a dict), the workers' event loop (uvloop or asyncio) and JSON tensor readers (native, simdjson or
lists), each probed the same way, and the PyTorch build and threads.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from recserve.errors import RecserveError


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _direct_io(directory: Path) -> tuple[str, str]:
    """The read mode a table file in ``directory`` would get, and why (BlockReader's own decision)."""
    from recserve.embedding.blockio import BlockReader

    try:
        probe = tempfile.NamedTemporaryFile(dir=directory, prefix=".recserve-doctor-")
    except OSError as exc:
        raise RecserveError(f"--dir {directory}: no test file can be written there ({exc.strerror}); give a "
                            "folder on the disk where tier files would live") from None
    with probe as f:
        f.write(b"\0" * 8192)
        f.flush()
        reader = BlockReader(f.name, 4096, engine="threads")
        try:
            mode = reader.mode
        finally:
            reader.close()
    why = "reads bypass the page cache" if mode == "O_DIRECT" else \
        "this file system refuses O_DIRECT: buffered reads, pages dropped after each read"
    kind = filesystem_type(directory)
    if kind in MEMORY_FILESYSTEMS:
        why = (f"a memory file system ({kind}): the table files would be in DRAM, so tiering saves none; give a "
               "folder on the SSD")
    return mode, why


MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs", "hugetlbfs")


def filesystem_type(directory: Path) -> str:
    """The type of the file system holding ``directory`` (the mount point its path lies deepest under, from
    /proc/self/mounts); "" where that cannot be read."""
    path, best, kind = str(Path(directory).resolve()), -1, ""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > best:
            best, kind = len(point), fields[2]
    return kind


def checks(directory: Path) -> dict:
    import torch

    from recserve.embedding import row_index, uring
    from recserve.embedding.rowcache import default_index
    from recserve.serving.wire import json_numbers
    from recserve.serving.worker import eventloop

    flags = _cpu_flags()
    uring_ok, uring_why = uring.probe()
    index = default_index()
    mode, mode_why = _direct_io(directory)
    loop, loop_why = eventloop.choose("auto")
    readers, readers_why = json_numbers.probe()
    return {
        "cpu": {"cores_usable": len(os.sched_getaffinity(0)), "avx2": "avx2" in flags,
                "avx512f": "avx512f" in flags},
        "torch": {"version": torch.__version__, "threads": torch.get_num_threads(),
                  "cuda": bool(torch.cuda.is_available())},
        "ssd_tier": {"directory": str(directory), "mode": mode, "mode_why": mode_why,
                     "engine": "io_uring" if uring_ok else "threads", "engine_why": uring_why,
                     "cache_index": index, "cache_index_why": row_index.available()[1],
                     "cache_bytes_per_row": round(row_index.slot_overhead_bytes("clock", index), 1)},
        "serving": {"event_loop": loop, "event_loop_why": loop_why, "json_readers": list(readers),
                    "json_readers_why": readers_why},
    }


def cmd_doctor(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if not directory.is_dir():
        raise RecserveError(f"--dir {directory} is not a directory")
    result = checks(directory)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cpu, tch, tier = result["cpu"], result["torch"], result["ssd_tier"]
    print(f"cpu         {cpu['cores_usable']} usable cores, avx2={'yes' if cpu['avx2'] else 'no'}, "
          f"avx512f={'yes' if cpu['avx512f'] else 'no'}")
    print(f"torch       {tch['version']}, {tch['threads']} threads, cuda={'yes' if tch['cuda'] else 'no'}")
    print(f"tier mode   {tier['mode']} in {tier['directory']} ({tier['mode_why']})")
    print(f"tier engine {tier['engine']} ({tier['engine_why']})")
    why = f"; {tier['cache_index_why']}" if tier["cache_index_why"] else ""
    print(f"tier cache  {tier['cache_index']} key index, {tier['cache_bytes_per_row']:g} B beside each cached row "
          f"(CLOCK{why})")
    serving = result["serving"]
    loop_why = f" ({serving['event_loop_why']})" if serving["event_loop_why"] else ""
    print(f"event loop  {serving['event_loop']} in the workers{loop_why}")
    readers = ", then ".join(serving["json_readers"] + ["lists"])
    print(f"json        tensors read by {readers}" + (f" ({serving['json_readers_why']})"
                                                        if serving["json_readers_why"] else ""))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="what this host offers recserve (CPU, torch, SSD-tier read path and cache "
                                      "index, the workers' event loop and JSON readers) and why",
                       description="Check what decides how recserve runs on this host (CPU vector extensions, "
                                   "PyTorch, the SSD tier's read path and row-cache index, the workers' event loop "
                                   "and JSON readers) and print each choice with the reason for any fallback.")
    p.add_argument("--dir", default=".", help="directory where tiered table files would live (default: .)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=cmd_doctor)
