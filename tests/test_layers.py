"""Data flows one way: no module imports from a higher layer (docs/ARCHITECTURE.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import recserve

# lowest first; a package may import from its own layer and any layer below it
LAYERS: list[set[str]] = [
    {"errors", "jsonio", "schema", "wire", "reference", "hostinfo", "tethered", "logs"},
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


def import_modules(node: ast.AST, relative: bool = False) -> list[str]:
    """The modules an import statement names (``from m import x``: ``m``); relative ones only if ``relative``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and (relative or node.level == 0):
        return [node.module]
    return []


def transport_violations(root: Path = SRC / "serving" / "transport") -> list[str]:
    """``serving/transport`` knows nothing of recserve: it imports only from itself."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            found += [f"{path.relative_to(root)}:{node.lineno}: imports {n}" for n in import_modules(node)
                      if n.startswith("recserve") and not n.startswith("recserve.serving.transport")]
    return found


def test_the_transport_layer_imports_nothing_else_of_recserve(tmp_path):
    assert transport_violations() == []
    (tmp_path / "planted.py").write_text("from recserve.serving.wire.codec import json_loads\n")
    assert transport_violations(tmp_path) == ["planted.py:1: imports recserve.serving.wire.codec"]


SANS_IO = ("h2frames", "h2streams", "h2limits", "h2heads", "h2requests", "h2replies", "h2closing", "h2connection")


def io_imports(root: Path = SRC / "serving" / "transport", modules: tuple[str, ...] = SANS_IO) -> list[str]:
    """The HTTP/2 protocol machine is sans-IO: no event loop, sockets, threads or selectors (``h2grpc`` adapts it)."""
    found = []
    for name in modules:
        path = root / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            found += [f"{name}.py:{node.lineno}: imports {n}" for n in import_modules(node, relative=True)
                      if n.split(".")[0] in {"asyncio", "socket", "selectors", "threading", "ssl", "uvloop"}
                      or n.endswith(".h2grpc")]
    return found


def test_the_http2_protocol_machine_does_no_io(tmp_path):
    assert io_imports() == []
    (tmp_path / "h2planted.py").write_text("import time\nfrom asyncio import get_running_loop\n")
    assert io_imports(tmp_path, ("h2planted",)) == ["h2planted.py:2: imports asyncio"]



# ---- inside serving: transport -> wire -> worker -> node, shards apart --------------------------------------------
SERVING = SRC / "serving"
SERVING_LAYERS = {"transport": 0, "wire": 1, "worker": 2, "node": 3}
SERVING_OK = {"shards": {"transport", "wire", "shards"}}  # ElasticRec's shard services and remote tables


def serving_part(module: str) -> str | None:
    """The sub-package of ``recserve.serving.<part>...`` ("" for the package itself), or None outside serving."""
    parts = module.split(".")
    if parts[:2] != ["recserve", "serving"]:
        return None
    return parts[2] if len(parts) > 2 else ""


def serving_violations(root: Path = SERVING) -> list[str]:
    """Imports from a higher serving sub-package (every import, TYPE_CHECKING and function-level ones included)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        here = rel.parts[0] if len(rel.parts) > 1 else ""
        if here in ("", "proto") or "proto" in rel.parts:
            continue  # the package's lazy __init__; generated stubs
        for line, module in _imports(path):
            there = serving_part(module)
            if there is None or there == here:
                continue
            allowed = (SERVING_OK[here] if here in SERVING_OK
                       else {p for p, level in SERVING_LAYERS.items() if level <= SERVING_LAYERS[here]})
            if there not in allowed:
                found.append(f"serving/{rel}:{line}: {here} imports serving.{there or '(package)'}")
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import; ``from recserve.serving import x`` counts as ``recserve.serving.x`` (the
    sub-package it reaches, not the package's lazy ``__init__``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "recserve.serving" and node.level == 0:
            out += [(node.lineno, f"recserve.serving.{a.name}") for a in node.names]
        else:
            out += [(node.lineno, module) for module in import_modules(node)]
    return out


def test_serving_sub_packages_import_only_downward(tmp_path):
    assert serving_violations() == []
    planted = tmp_path / "wire"
    planted.mkdir()
    (planted / "x.py").write_text("if True:\n    from recserve.serving.node.config import NodeConfig\n")
    assert serving_violations(tmp_path) == ["serving/wire/x.py:2: wire imports serving.node"]


def module_graph(root: Path = SRC) -> dict[str, set[str]]:
    """recserve module -> the recserve modules it imports at module level (TYPE_CHECKING blocks included; imports
    inside functions are deferred on purpose and do not make a circle at import time)."""
    graph: dict[str, set[str]] = {}
    modules = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
               for p in root.rglob("*.py")}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        edges: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        for node in _module_level(tree.body):
            targets = import_modules(node) + ([f"{node.module}.{a.name}" for a in node.names]
                                              if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Import statements run at import time: top level, and inside top-level ``if``/``try`` blocks."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.If):
            out += _module_level(node.body) + _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _module_level(node.body) + _module_level(node.orelse) + _module_level(node.finalbody)
    return out


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circle_in_serving():
    serving = {k: v for k, v in module_graph().items() if k.startswith("recserve.serving")}
    assert import_circles(serving) == []
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
