"""The import graph of the package, read from the source (every import statement, those
inside functions too): no module imports itself through others, and the packages form
layers, each importing only from the layers below it.

    core         the pipeline and what it is made of (below)
    ops          the handlers (found by the registry by name, as plugins)
    check        the accuracy check; export: the files a conversion writes (never each other)
    calibration  calibration samples and activation-range methods
    quant        the quantized files and their check
    generative   several signatures in one file, for decoders with a KV cache
    front        what users run: api, conversion, cli/, batching/

Inside core, rooms in their own order: the base modules at the package root (errors,
interrupts, logs, progress, startup, supervision, version) < ir/ < passes/ and layout/ (never
each other) < translate/ < tflite/ < pipeline.py. ir/, passes/ and layout/ never import
TensorFlow or Keras: the plan is a pure function of the graph.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FRONT = {"onnx2tf_alt", "onnx2tf_alt.__main__", "onnx2tf_alt.api", "onnx2tf_alt.conversion"}
FRONT_PACKAGES = ("cli", "batching")
LAYERS = {"core": 0, "ops": 1, "check": 2, "export": 2, "calibration": 3, "quant": 4,
          "generative": 5, "front": 6}


def module_files() -> dict[str, pathlib.Path]:
    """Module name -> file, with ops/ installed as onnx2tf_alt.ops (pyproject.toml)."""
    found = {}
    for top, package in (("onnx2tf_alt", "onnx2tf_alt"), ("ops", "onnx2tf_alt.ops"),
                         ("calibration", "calibration")):
        for path in (ROOT / top).rglob("*.py"):
            parts = [package, *path.relative_to(ROOT / top).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import mod` imports the module; `from mod import name` the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def group_of(module: str) -> str:
    parts = module.split(".")
    if module in FRONT or (len(parts) > 1 and parts[1] in FRONT_PACKAGES):
        return "front"
    if parts[0] == "calibration":
        return "calibration"
    if len(parts) > 1 and parts[1] in ("ops", "check", "export", "quant", "generative"):
        return parts[1]
    return "core"


# Rooms of core and their order; a module imports its own room or a lower rank only.
CORE_ROOMS = {"base": 0, "ir": 1, "passes": 2, "layout": 2, "translate": 3, "tflite": 4,
              "pipeline": 5}
BASE = {"errors", "interrupts", "logs", "progress", "startup", "supervision", "version"}
PURE_ROOMS = ("ir", "passes", "layout")  # never TensorFlow or Keras
ROOT_MODULE_LIMIT = 12


def room_of(module: str) -> str:
    """The core room of a core module."""
    name = module.split(".")[1]
    return "base" if name in BASE else name


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    graph = import_graph()
    assert len(graph) > 100
    assert "onnx2tf_alt.pipeline" in graph["onnx2tf_alt.conversion"]
    assert "onnx2tf_alt.translate.registry" in graph["onnx2tf_alt.ops.activation"]
    assert {group_of(m) for m in graph} == set(LAYERS)
    assert {room_of(m) for m in graph if group_of(m) == "core"} == set(CORE_ROOMS)


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_packages_import_only_from_layers_below():
    wrong = sorted(
        f"{a} ({group_of(a)}) imports {b} ({group_of(b)})"
        for a, targets in import_graph().items() for b in targets
        if group_of(a) != group_of(b) and LAYERS[group_of(b)] >= LAYERS[group_of(a)]
    )
    assert wrong == []


def test_core_rooms_import_only_their_own_or_lower_rooms():
    graph = import_graph()
    wrong = sorted(
        f"{a} ({room_of(a)}) imports {b} ({room_of(b)})"
        for a, targets in graph.items() if group_of(a) == "core"
        for b in targets if group_of(b) == "core" and room_of(a) != room_of(b)
        and CORE_ROOMS[room_of(b)] >= CORE_ROOMS[room_of(a)]
    )
    assert wrong == []


def test_graph_passes_and_layout_never_import_tensorflow():
    heavy = ("tensorflow", "tf_keras", "keras", "ai_edge_litert")
    found = []
    for name, path in module_files().items():
        if group_of(name) != "core" or room_of(name) not in PURE_ROOMS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            found += [f"{name}: {t}" for t in targets if t.split(".")[0] in heavy]
    assert found == []


def test_the_handlers_and_the_plan_load_without_tensorflow():
    """Registering every handler, planning a model and writing it directly import no
    TensorFlow (translate/lazy.py): a process of its own, since this one has it loaded."""
    script = (
        "import sys\n"
        "from onnx2tf_alt.translate.registry import all_handlers\n"
        "import onnx2tf_alt.pipeline, onnx2tf_alt.tflite.direct\n"
        "assert len(all_handlers()) > 200\n"
        "print(sorted(m for m in ('tensorflow', 'tf_keras', 'keras') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_the_package_root_holds_few_modules():
    """Everything else lives in a room named after what it holds."""
    root = sorted(p.name for p in (ROOT / "onnx2tf_alt").glob("*.py"))
    assert len(root) <= ROOT_MODULE_LIMIT, root


def test_ops_do_not_borrow_private_helpers():
    """A helper two handler modules share lives in an ops/_*.py module, under a public name."""
    borrowed = []
    for path in (ROOT / "ops").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            ours = isinstance(node, ast.ImportFrom) and (
                node.level > 0 or (node.module or "").startswith("onnx2tf_alt"))
            if ours:
                borrowed += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_")]
    assert borrowed == []


def test_every_package_is_installed():
    """pyproject.toml lists the packages by name: a new one missing there imports from a
    checkout but not from a wheel (the Docker image)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    packages = {m for m, path in module_files().items() if path.name == "__init__.py"}
    assert packages == listed
