"""Per-function and per-thread CPU between two dumps of fn_cpu.py: python3 fn_cpu_diff.py A_DIR B_DIR."""
import json
import pathlib
import sys

a_dir, b_dir = map(pathlib.Path, sys.argv[1:3])
for b_file in sorted(b_dir.glob("*.json")):
    a, b = json.loads((a_dir / b_file.name).read_text()), json.loads(b_file.read_text())
    seconds = b["at"] - a["at"]
    print(f"pid {b_file.stem}, {seconds:.1f} s")
    for tid, cpu in sorted(b["threads"].items(), key=lambda kv: -kv[1]):
        used = cpu - a["threads"].get(tid, 0.0)
        if used > 0.05:
            print(f"   thread {tid:>8}: {used:6.2f} s ({100 * used / seconds:3.0f}% of a core)")
    for name, (calls, total, *own) in sorted(b["functions"].items(), key=lambda kv: -kv[1][1]):
        calls0, total0, *own0 = a["functions"].get(name, (0, 0.0, 0.0))
        if calls > calls0:
            n, t = calls - calls0, total - total0
            line = f"   {name:34s} {n:7d} calls {t:7.3f} s {1e6 * t / n:8.1f} us a call"
            if own:  # dumps with exclusive time: without the chosen functions it called
                line += f", {1e6 * (own[0] - own0[0]) / n:8.1f} us of its own"
            print(line)
