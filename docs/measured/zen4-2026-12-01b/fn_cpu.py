"""Scratch instrumentation, not part of recserve: each worker's CPU time (``time.thread_time``) inside chosen
functions, by thread, inclusive and exclusive of the other chosen functions they call, with every thread's CPU,
written to /tmp/fn_cpu/<pid>.json every 2 s (cumulative; per function: calls, inclusive s, exclusive s).

Use on a copy of the tree: put this file at ``src/recserve/_fn_cpu.py`` and call ``install()`` first thing in
``worker/main.py``'s ``worker_main``; run a benchmark with ``--variants prof=<copy>/src``; diff two dumps."""
import functools
import json
import os
import threading
import time

TOTALS: dict[str, list] = {}
TARGETS = {  # module: (class, method) pairs
    "recserve.serving.transport.h2connection": [("H2Connection", "receive"), ("H2Connection", "received_into")],
    "recserve.serving.transport.h2replies": [("ReplyWriter", "flush"), ("ReplyWriter", "send_reply")],
    "recserve.serving.worker.links": [("Arena", "put"), ("LinkClient", "submit"), ("Link", "settled")],
    "recserve.serving.worker.siblings": [("SiblingClient", "less_loaded"), ("SiblingServer", "_queue")],
    "recserve.serving.worker.model_path": [("ModelPath", "compute"), ("ModelPath", "check_owed")],
    "recserve.serving.worker.plane": [("WorkerPlane", "enqueue"), ("WorkerPlane", "_forward"),
                                      ("WorkerPlane", "_passed")],
    "recserve.serving.worker.grpc_methods": [("WorkerMethods", "_infer"), ("WorkerMethods", "_head"),
                                             ("WorkerMethods", "_tensors")],
}


STACK = threading.local()  # per thread: CPU seconds spent in chosen functions called by each open one


def _wrap(cls, name):
    f = getattr(cls, name)
    base = f"{cls.__name__}.{name}"
    depth = threading.local()

    @functools.wraps(f)
    def timed(*args, **kwargs):
        label = base + ("" if threading.current_thread() is threading.main_thread() else "@thread")
        level = getattr(depth, "n", 0)
        depth.n = level + 1
        children = STACK.__dict__.setdefault("open", [])
        children.append(0.0)
        start = time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            spent = time.thread_time() - start
            inner = children.pop()
            if children:
                children[-1] += spent
            depth.n = level
            entry = TOTALS.setdefault(label, [0, 0.0, 0.0])
            entry[2] += spent - inner
            if level == 0:  # a recursive call is counted once
                entry[0] += 1
                entry[1] += spent

    setattr(cls, name, timed)


def _threads() -> dict[str, float]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        out["main" if int(tid) == os.getpid() else tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _dump() -> None:
    os.makedirs("/tmp/fn_cpu", exist_ok=True)
    while True:
        time.sleep(2)
        with open(f"/tmp/fn_cpu/{os.getpid()}.json", "w") as fh:
            json.dump({"at": time.time(), "functions": TOTALS, "threads": _threads()}, fh)


def install() -> None:
    import importlib

    for module, pairs in TARGETS.items():
        mod = importlib.import_module(module)
        for cls, name in pairs:
            _wrap(getattr(mod, cls), name)
    threading.Thread(target=_dump, daemon=True).start()
