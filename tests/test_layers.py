"""Data flows one way: no module imports from a higher layer (docs/ARCHITECTURE.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import recserve

# lowest first; a package may import from its own layer and any layer below it
LAYERS: list[set[str]] = [
    {"errors", "jsonio", "wire", "reference", "hostinfo"},
    {"specs"},
    {"zoo", "workload", "embedding"},
    {"profiles"},
    {"serving"},                      # the node server: runs a node config; never plans, never reads plans
    {"measure", "perfmodel"},         # measure drives node servers; both write Profile tables
    {"planners"},                     # Profile tables -> Plans
    {"policies", "sim"},              # online decisions, and their replay
    {"deploy"},                       # Plans -> node configs, processes, Ray Serve apps, manifests
    {"commands", "cli", "demo", "report", "__init__", "__main__"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}
SRC = Path(recserve.__file__).parent


def top_level(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def recserve_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, imported recserve package) for every import, including those inside functions."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "recserve":
                names = [f"recserve.{a.name}" for a in node.names]
        else:
            continue
        out += [(node.lineno, n.split(".")[1]) for n in names if n.startswith("recserve.")]
    return sorted(out)


def upward_imports(here: str, tree: ast.AST, where: str) -> list[str]:
    found = []
    for line, target in recserve_imports(tree):
        assert target in LAYER_OF, f"{where}:{line}: imports unknown package {target!r}"
        if LAYER_OF[target] > LAYER_OF[here]:
            found.append(f"{where}:{line}: {here} (layer {LAYER_OF[here]}) imports {target} (layer {LAYER_OF[target]})")
    return found


def violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if "proto" in path.relative_to(SRC).parts:
            continue  # generated gRPC stubs
        here = top_level(path)
        assert here in LAYER_OF, f"{path.relative_to(SRC)}: package {here!r} has no layer; add it to LAYERS"
        found += upward_imports(here, ast.parse(path.read_text(), str(path)), str(path.relative_to(SRC)))
    return found


def test_no_import_from_a_higher_layer():
    assert violations() == []


def test_the_check_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from recserve.planners.plan import Plan\nimport recserve.specs\n")
    assert recserve_imports(tree) == [(2, "planners"), (3, "specs")]
    assert upward_imports("perfmodel", tree, "x.py") == ["x.py:2: perfmodel (layer 5) imports planners (layer 6)"]
    assert upward_imports("deploy", tree, "x.py") == []


def transport_violations(root: Path = SRC / "serving" / "transport") -> list[str]:
    """``serving/transport`` knows nothing of recserve: it imports only from itself."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                     else [])
            found += [f"{path.relative_to(root)}:{node.lineno}: imports {n}" for n in names
                      if n.startswith("recserve") and not n.startswith("recserve.serving.transport")]
    return found


def test_the_transport_layer_imports_nothing_else_of_recserve(tmp_path):
    assert transport_violations() == []
    (tmp_path / "planted.py").write_text("from recserve.serving.codec import json_loads\n")
    assert transport_violations(tmp_path) == ["planted.py:1: imports recserve.serving.codec"]


SANS_IO = ("h2frames", "h2streams", "h2limits", "h2heads", "h2requests", "h2replies", "h2connection")


def io_imports(root: Path = SRC / "serving" / "transport", modules: tuple[str, ...] = SANS_IO) -> list[str]:
    """The HTTP/2 protocol machine is sans-IO: no event loop, sockets, threads or selectors (``h2grpc`` adapts it)."""
    found = []
    for name in modules:
        path = root / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{name}.py:{node.lineno}: imports {n}" for n in names
                      if n.split(".")[0] in {"asyncio", "socket", "selectors", "threading", "ssl", "uvloop"}
                      or n.endswith(".h2grpc")]
    return found


def test_the_http2_protocol_machine_does_no_io(tmp_path):
    assert io_imports() == []
    (tmp_path / "h2planted.py").write_text("import time\nfrom asyncio import get_running_loop\n")
    assert io_imports(tmp_path, ("h2planted",)) == ["h2planted.py:2: imports asyncio"]
