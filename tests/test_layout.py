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


# Names of frameworks and of the libraries their allreduce runs on.  Outside the registry (firescale.frameworks)
# and the backends, a module asks the registry what a framework is or can do instead of comparing its name.
NAMED = {"tensorflow", "pytorch", "horovod", "torch", "torch.distributed", "mpi4py", "nccl", "gloo", "mpi"}
# Modules that are one library's own vocabulary: the decoding of what each collective library's settings did
# (cluster.collectives), and the check of how Horovod was built (cluster.horovod_build).
MAY_COMPARE_NAMES = {"firescale.frameworks", "firescale.cluster.collectives", "firescale.cluster.horovod_build"}


def _name_comparisons(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each comparison or match with a framework's or library's name, and of each dict keyed by
    a framework's name (a table of framework facts)."""
    def named(*operands: ast.AST) -> list[str]:
        """The names among the operands themselves, or the elements of a tuple, list or set among them (not
        the arguments of a call compared: `find_spec("mpi4py") is None` asks for a module)."""
        flat = [e for o in operands for e in (o.elts if isinstance(o, ast.Tuple | ast.List | ast.Set) else [o])]
        return [n.value for n in flat
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.lower() in NAMED]

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            found += [(node.lineno, name) for name in named(node.left, *node.comparators)]
        elif isinstance(node, ast.match_case):
            values = [n.value for n in ast.walk(node.pattern) if isinstance(n, ast.MatchValue)]
            found += [(node.pattern.lineno, name) for name in named(*values)]
        elif isinstance(node, ast.Dict):
            found += [(node.lineno, k.value) for k in node.keys if isinstance(k, ast.Constant)
                      and k.value in ("tensorflow", "pytorch")]
    return found


def test_outside_the_registry_and_the_backends_no_module_compares_a_framework_s_name():
    modules = _modules()
    comparing = {name: _name_comparisons(ast.parse(path.read_text(), str(path))) for name, path in modules.items()
                 if not name.startswith(tuple(BACKENDS)) and name not in MAY_COMPARE_NAMES}
    assert {name: found for name, found in comparing.items() if found} == {}


def test_the_name_check_finds_comparisons_matches_and_tables():
    source = ('if framework == "pytorch": pass\n'
              'ok = library in ("NCCL", "openmpi")\n'
              'match f:\n    case "tensorflow": pass\n'
              'LOOPS = {"tensorflow": 1}\n'
              'versions = {"torch": "2.5"}\n'          # a record's field, not a table of frameworks
              'if chosen.names_process_group: pass\n'
              'here = find_spec("mpi4py") is not None\n')
    assert _name_comparisons(ast.parse(source)) == [(1, "pytorch"), (2, "NCCL"), (4, "tensorflow"), (5, "tensorflow")]
