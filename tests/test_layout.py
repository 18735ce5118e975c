"""The layout is the architecture (docs/ARCHITECTURE.md): each room imports only what its rules allow, the import
graph has no cycle, the charts room and the table types stay free of torch and transformers, the top-level names keep
working, and no tracked file points outside the repository."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHARTS_DIR = ROOT / "cwviz" / "charts"
#: Every module of the charts room (found on disk, so a new one is checked too) and the table types.
TORCH_FREE = [
    "cwviz.charts",
    *(f"cwviz.charts.{m.name}" for m in pkgutil.iter_modules([str(CHARTS_DIR)])),
    "cwviz.analyses.schema",
    "cwviz.vocabulary",
]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_neither_torch_nor_transformers(module):
    """Each module alone, in a fresh interpreter: a notebook can chart a saved table without torch."""
    code = (
        f"import sys, {module}; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')); "
        "assert not heavy, heavy[:5]"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, f"importing {module} imports torch or transformers: {done.stderr[-600:]}"


#: What each room may import (cwviz rooms and the heavy third-party packages; docs/ARCHITECTURE.md, "What may import
#: what"). ``vocabulary`` (the words every room shares) imports nothing, so every room may import it.
ROOMS: dict[str, set[str]] = {
    "vocabulary": set(),
    "core": {"core", "torch", "transformers", "vocabulary"},
    "analyses": {"core", "analyses", "torch", "vocabulary"},
    "analyses.schema": {"vocabulary"},
    "charts": {"charts", "analyses.schema", "altair", "vocabulary"},
    "app": {"core", "analyses", "charts", "app", "torch", "streamlit", "altair", "vocabulary"},
    "cli": {"core", "analyses", "charts", "cli", "app.launch", "torch", "vocabulary"},
    "plot": {"core", "analyses", "charts", "torch", "altair", "vocabulary"},
    # app.py and views/*.py: the dashboard's scripts reach the library through the app, the tables and charts, and
    # cwviz's top-level names (its errors); never the core, torch or transformers.
    "views": {"top", "app", "analyses", "charts", "streamlit", "altair", "vocabulary"},
}
#: Imports outside the rules, each with its reason.
EXCEPTIONS = {
    ("cwviz.cli.main", "transformers"): "quiets transformers' progress bars and logging before a command prints",
    ("cwviz.core.util.parallel", "top"): "a results manifest records the package's version (cwviz.__version__)",
}
TRACKED = ("torch", "transformers", "streamlit", "altair")
#: The most lines a module of cwviz may have: one module, one job. The core's modules, each one step of the method or
#: of loading a model, have less room.
MAX_MODULE_LINES = 600
MAX_CORE_MODULE_LINES = 450


def _module_name(path: Path) -> str:
    """``cwviz/core/method/analysis.py`` -> ``cwviz.core.method.analysis``; ``cwviz/core/__init__.py`` -> ``cwviz.core``."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


CWVIZ_MODULES = {_module_name(path): path for path in sorted((ROOT / "cwviz").rglob("*.py"))}
SCRIPTS = [ROOT / "app.py", *sorted((ROOT / "views").glob("*.py"))]


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of what ``module`` (at ``path``) imports anywhere in its body (at the top, inside functions and
    classes, under ``if TYPE_CHECKING:``), relative imports resolved: ``from . import memory`` gives
    ``cwviz.core.method.memory``, ``from .measures import KINDS`` gives ``cwviz.core.method.measures.KINDS``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def _cwviz_module(name: str) -> str | None:
    """The module of cwviz an imported name lies in (``cwviz.core.method.measures.KINDS`` -> ``cwviz.core.method.measures``)."""
    while name and name not in CWVIZ_MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _room_of(name: str) -> str | None:
    """``cwviz.charts.token`` -> ``charts``; ``cwviz.__version__`` -> ``top``; ``torch.nn`` -> ``torch``; None for
    what no rule covers."""
    parts = name.split(".")
    if parts[0] == "cwviz":
        module = _cwviz_module(name)
        if module == "cwviz":
            return "top"
        rest = module.removeprefix("cwviz.")
        for special in ("analyses.schema", "app.launch"):
            if rest == special or rest.startswith(special + "."):
                return special
        return rest.split(".")[0]
    return parts[0] if parts[0] in TRACKED else None


def _check(module: str, room: str, names: set[str]) -> list[str]:
    wrong = []
    for name in sorted(names):
        target = _room_of(name)
        if target is None or target in ROOMS[room] or target.split(".")[0] in ROOMS[room]:
            continue  # a parent room's permission covers analyses.schema and app.launch too
        if (module, target) not in EXCEPTIONS:
            wrong.append(f"{module} imports {name}")
    return wrong


def test_rooms_import_only_what_they_may():
    """core knows nothing above it; charts see only the torch-free table types; only the app imports Streamlit;
    the table types import nothing of cwviz but the shared words; the pages never reach into the core."""
    wrong = []
    for module, path in CWVIZ_MODULES.items():
        room = "analyses.schema" if module == "cwviz.analyses.schema" else module.split(".")[1] if "." in module else None
        if room not in ROOMS:
            continue  # cwviz/__init__.py (lazy names) and __main__.py
        wrong += _check(module, room, _imports(path, module))
    for path in SCRIPTS:
        wrong += _check(str(path.relative_to(ROOT)), "views", _imports(path, "__main__"))
    assert not wrong, "imports across the rooms of docs/ARCHITECTURE.md:\n" + "\n".join(wrong)


def test_the_import_graph_of_cwviz_has_no_cycle():
    """Every import of every module, those inside functions included: a module that needs a function-level import
    to dodge a cycle is telling us where the helper really lives (docs/ARCHITECTURE.md, "The order of core")."""
    graph = {
        module: sorted({m for m in map(_cwviz_module, _imports(path, module)) if m and m != module})
        for module, path in CWVIZ_MODULES.items()
    }
    done: set[str] = set()
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append(" -> ".join(path[path.index(module) :] + [module]))
            return
        if module in done:
            return
        for target in graph[module]:
            visit(target, path + [module])
        done.add(module)

    for module in graph:
        visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles)))


def test_only_the_services_cache_and_no_module_is_over_the_limit():
    """The app's services are the only Streamlit caching; one module, one job: none over MAX_MODULE_LINES lines, and
    none of the core over MAX_CORE_MODULE_LINES (``cwviz.core.method.analysis`` included)."""
    caching = [m for m, path in CWVIZ_MODULES.items() if "st.cache_" in path.read_text(encoding="utf-8") and not m.endswith("services")]
    caching += [str(p.relative_to(ROOT)) for p in SCRIPTS if "st.cache_" in p.read_text(encoding="utf-8")]
    assert not caching, f"Streamlit caching outside cwviz.app's services: {caching}"
    assert "cwviz.core.method.analysis" in CWVIZ_MODULES
    long = {}
    for module, path in CWVIZ_MODULES.items():
        limit = MAX_CORE_MODULE_LINES if module.startswith("cwviz.core.") else MAX_MODULE_LINES
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > limit:
            long[module] = f"{lines} lines (limit {limit})"
    assert not long, f"modules over their limit (split them by job): {long}"


#: Assignments to another package's module attributes that cwviz makes, each with the test that pins it.
SWAPS = {
    ("cwviz.core.loading.checkpoints", "gguf.GGUFReader"): "parsed_once, pinned by tests/core/test_gguf_parse.py",
}


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """Names a module binds by importing something of another package, anywhere in it, and what they stand for:
    ``import gguf as g`` -> {"g": "gguf"}; ``import numpy.linalg`` -> {"numpy": "numpy"}; ``from torch import nn`` ->
    {"nn": "torch.nn"}. cwviz's own names are left out (relative imports, ``cwviz.*``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "cwviz":
                    names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and node.module.split(".")[0] != "cwviz":
            names.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
    return names


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return [*base, node.attr]
    return None


def test_no_module_assigns_to_another_packages_attributes():
    """A library leaves its host alone (docs/STYLE): no swapped ``np``, no patched class or function of another package,
    which every thread of the host would see. The one exception, in :data:`SWAPS`, has a test that fails when the
    transformers behaviour it relies on changes."""
    wrong, seen = [], set()
    for module, path in [*CWVIZ_MODULES.items(), *((str(p.relative_to(ROOT)), p) for p in SCRIPTS)]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _imported_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="*")]
            else:
                continue
            for target in targets:
                parts = _dotted(target) if isinstance(target, ast.Attribute) else None
                if parts and parts[0] in imported:
                    name = ".".join([imported[parts[0]], *parts[1:]])
                    if (module, name) in SWAPS:
                        seen.add((module, name))
                    else:
                        wrong.append(f"{module}:{node.lineno} assigns {name}")
    assert not wrong, "assignments to another package's attributes (pass your own object instead):\n" + "\n".join(wrong)
    assert seen == set(SWAPS), f"SWAPS lists swaps that are gone (remove them, and their pinning test): {set(SWAPS) - seen}"


def test_only_the_core_reads_an_analysis_layer_records():
    """Outside the core, an analysis is read through its public methods (``key_mask``, ``values``, ``row_blocks``,
    ``layer_record`` ...), never by subscripting its records: on a prompt whose records are on disk, ``records[layer]``
    reads back a whole layer to learn what the methods give without it. Elsewhere "records" are a sweep's results."""
    core = (ROOT / "cwviz" / "core", ROOT / "tests" / "core")
    wrong = []
    for path in sorted(ROOT.glob("**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in ("cwviz", "views", "benchmarks", "tests", "app.py") or any(path.is_relative_to(c) for c in core):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr.endswith("records"):
                wrong.append(f"{rel}:{node.lineno}: .{node.value.attr}[...]")
            elif isinstance(node, ast.Attribute) and node.attr == "_layer_records":
                wrong.append(f"{rel}:{node.lineno}: ._layer_records")
    assert not wrong, "an analysis's layer records read outside cwviz.core (use the Analysis methods):\n" + "\n".join(wrong)


def test_top_level_names():
    from cwviz import analyze, decomposition, faithfulness, load_model, sinks, to_dict, to_json
    from cwviz.analyses import faithfulness as faithfulness_module
    from cwviz.analyses import sinks as sinks_module
    from cwviz.analyses import tables
    from cwviz.core.loading.models import load_model as core_load_model
    from cwviz.core.method import export
    from cwviz.core.method.analysis import analyze as core_analyze

    assert (analyze, load_model, sinks, faithfulness) == (core_analyze, core_load_model, sinks_module, faithfulness_module)
    assert (decomposition, to_dict, to_json) == (tables.decomposition, export.to_dict, export.to_json)


# Built from pieces so that this file does not match itself.
OUTSIDE = ("..", "/shared")
MACHINE = ("/wo", "rk/")


def _tracked_text_files() -> list[Path]:
    """Files git tracks (every file under the root, minus build outputs, where this is not a git checkout)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=ROOT, check=True).stdout.decode().split("\0")
        paths = [ROOT / name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "__pycache__", "dist", "build", "artifacts"}
        paths = [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    texts = []
    for path in paths:
        if path.is_file():
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary (images, model files)
            texts.append(path)
    return texts


def test_no_tracked_file_refers_to_a_path_outside_the_repository():
    patterns = ["".join(OUTSIDE), "".join(MACHINE)]
    found = []
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if any(p in line for p in patterns):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "paths outside the repository (use a path inside it, an option or an environment variable):\n" + "\n".join(found)
