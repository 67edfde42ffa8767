"""The package's module graph, imports inside functions included: no cycles, and the
boundaries the layout promises (the runtime never imports ExecuTorch or transformers; the
ahead-of-time side never imports a WebGPU implementation)."""

import ast
from pathlib import Path

import pytest

import pipeline

ROOT = Path(pipeline.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ["pipeline", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imported(module: str, path: Path) -> set[str]:
    """Every name `module` imports anywhere in its body (functions included), as written."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _ours(name: str) -> str | None:
    """The module of ours that importing `name` runs last (a.b.c for `from a.b import c`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    """module -> modules whose code importing it runs: each target and the packages above it
    (importing a.b.c runs a/__init__ and a/b/__init__), except packages the module sits in."""
    graph = {}
    for module, path in MODULES.items():
        targets = set()
        for name in _imported(module, path):
            target = _ours(name)
            while target:
                if target != module and not module.startswith(target + "."):
                    targets.add(target)
                target = target.rpartition(".")[0]
        graph[module] = targets
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycles_between_rooms():
    """The rooms (pipeline.aot, pipeline.evaluation, ..., and each top-level module) import one
    another one way only."""
    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    rooms: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    cycle = _cycle(rooms)
    assert cycle is None, "import cycle between rooms: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _foreign(prefix: str) -> dict[str, set[str]]:
    """Top-level packages other than ours imported by each module under `prefix`."""
    return {module: {name.partition(".")[0] for name in _imported(module, path) if not name.startswith("pipeline")}
            for module, path in MODULES.items() if module == prefix or module.startswith(prefix + ".")}


@pytest.mark.parametrize("prefix, forbidden", [
    ("pipeline.runtime", {"executorch", "transformers"}),
    ("pipeline.wgsl", {"executorch", "transformers", "wgpu", "pydawn", "torch"}),
    ("pipeline.aot", {"wgpu", "pydawn"}),
    ("pipeline.pte", {"wgpu", "pydawn", "transformers"}),
    ("pipeline.blob", {"executorch", "transformers", "wgpu", "pydawn", "torch"}),
])
def test_layer_boundaries(prefix, forbidden):
    crossing = {module: sorted(names & forbidden) for module, names in _foreign(prefix).items() if names & forbidden}
    assert not crossing


def test_runtime_reaches_only_the_kernel_the_blob_and_the_call_library():
    """The runtime imports no layer of ours above it: besides itself, the WGSL package, the
    blob format it decodes, the build of its C++ call library, and the errors it shares with
    the ahead-of-time side, the environment variables it shares with the C++ and the bounded
    file reads every reader shares (modules that import nothing of ours)."""
    graph = _graph()
    allowed = {"pipeline", "pipeline.wgsl", "pipeline.blob", "pipeline.native", "pipeline.native.build",
               "pipeline.errors", "pipeline.environment", "pipeline.ioutil"}
    assert graph["pipeline.errors"] == set() and graph["pipeline.environment"] == set() and graph["pipeline.ioutil"] == set()
    for module in (m for m in graph if m.startswith("pipeline.runtime")):
        outside = {m for m in graph[module] if not m.startswith(("pipeline.runtime", "pipeline.wgsl"))}
        assert outside <= allowed, (module, sorted(outside - allowed))
