"""The package's shape, read from its imports: no import circle, and a performance model that stays pure."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "firescale"
# model/ is arithmetic over nets and sites: it must not reach the trainer, the sweep or a command line.
MODEL_MAY_NOT_IMPORT = ("tensorflow", "horovod", "argparse", "firescale.sweep", "firescale.predict",
                        "firescale.commands", "firescale.train", "firescale.bench", "firescale.report")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module `path` imports, at the top or inside a function; `from a import b` counts a.b when b is
    a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(path, modules) if m in modules and m != name and
                   not name.startswith(m + ".")}   # a package's own __init__ is not an arrow back
            for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_through_others():
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_the_model_imports_no_tensorflow_no_command_line_and_nothing_of_the_sweep():
    modules = _modules()
    bad = {name: sorted(m for m in _imports(path, modules) if m.startswith(MODEL_MAY_NOT_IMPORT))
           for name, path in modules.items() if name.startswith("firescale.model")}
    assert {k: v for k, v in bad.items() if v} == {}


# The folders from the top floor down (docs/layout.md): a folder imports only from folders after it.
FLOORS = ("commands", "store", "report", "predict", "bench", "sweep", "train", "jobs", "model", "cluster", "data",
          "nets", "caffe", "testing")


def test_every_folder_imports_only_from_the_folders_below_it():
    modules = _modules()
    floor = {name: i for i, name in enumerate(FLOORS)}
    upward = sorted((name, m) for name, path in modules.items() for m in _imports(path, modules)
                    if name.count(".") >= 2 and m.count(".") >= 1
                    and name.split(".")[1] in floor and m.split(".")[1] in floor
                    and floor[m.split(".")[1]] < floor[name.split(".")[1]])
    assert upward == []
    assert set(FLOORS) == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


FRAMEWORKS = ("tensorflow", "horovod", "torch")
BACKENDS = {"firescale.train.tensorflow": ("tensorflow", "horovod"), "firescale.train.torch": ("torch",)}
# Modules outside the backends that still import a framework themselves: the yardsticks of `bench/` (a bare
# loop and an allreduce as a user of each framework writes them, the GPU check's PyTorch step timings beside
# the trainer's steps) and the Horovod build check.  The list may shrink, never grow but for a yardstick.
FRAMEWORK_OUTSIDE_BACKENDS = {"firescale.bench.allreduce_tensorflow", "firescale.bench.allreduce_torch",
                              "firescale.bench.bare_loop", "firescale.bench.bare_loop_torch", "firescale.bench.io",
                              "firescale.bench.memory_probe", "firescale.bench.gpu_steps", "firescale.bench.layers",
                              "firescale.cluster.horovod_build"}


def _framework_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    return {m.split(".")[0] for m in _imports(path, modules) if m.split(".")[0] in FRAMEWORKS}


def test_only_a_backend_imports_its_framework_and_no_backend_the_other():
    modules = _modules()
    outside = {name for name, path in modules.items()
               if _framework_imports(path, modules) and not name.startswith(tuple(BACKENDS))}
    assert outside <= FRAMEWORK_OUTSIDE_BACKENDS, sorted(outside - FRAMEWORK_OUTSIDE_BACKENDS)
    for package, own in BACKENDS.items():
        for name, path in modules.items():
            if not (name == package or name.startswith(package + ".")):
                continue
            assert _framework_imports(path, modules) <= set(own), name
            others = [m for m in _imports(path, modules) if m.startswith(tuple(b for b in BACKENDS if b != package))]
            assert others == [], (name, others)
