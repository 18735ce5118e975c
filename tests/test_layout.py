"""The layout is the architecture (docs/ARCHITECTURE.md): each room imports only what its rules allow (the document's
table is :data:`ROOMS`), the import graph of the whole tree has no cycle and follows the order the document writes
(the test prints it), the charts room and the table types stay free of torch and transformers, no module or function
is over its size, the top-level names keep working, and no tracked file points outside the repository."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHARTS_DIR = ROOT / "cwviz" / "charts"
#: Every module of the charts room (found on disk, so a new one is checked too), the table types, and the command
#: line's start (its parsers, and the main that imports a command's module only once the arguments are parsed).
TORCH_FREE = [
    "cwviz.charts",
    *(f"cwviz.charts.{m.name}" for m in pkgutil.iter_modules([str(CHARTS_DIR)])),
    "cwviz.analyses.schema",
    "cwviz.core.defaults",
    "cwviz.core.vocabulary",
    "cwviz.cli.main",
    "cwviz.cli.options",
    "cwviz.cli.parsers",
    "cwviz.cli.sweep_parsers",
]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_neither_torch_nor_transformers(module):
    """Each module alone, in a fresh interpreter: a notebook can chart a saved table without torch."""
    code = (
        f"import sys, {module}; heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', "
        "'transformers')); assert not heavy, heavy[:5]"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, f"importing {module} imports torch or transformers: {done.stderr[-600:]}"


#: What each room may import (cwviz rooms and the heavy third-party packages; docs/ARCHITECTURE.md, "What may import
#: what"). ``core.vocabulary`` (the words every room shares) imports nothing but the errors (which import nothing),
#: and ``core.defaults`` (every default value, once) imports nothing at all, so every room may import both.
SHARED = {"core.vocabulary", "core.defaults"}
ROOMS: dict[str, set[str]] = {
    "core.vocabulary": {"core.util.errors"},
    "core.defaults": set(),
    "core": {"core", "torch", "transformers"} | SHARED,
    "analyses": {"core", "analyses", "torch"} | SHARED,
    "analyses.schema": SHARED,
    "charts": {"charts", "analyses.schema", "altair"} | SHARED,
    "app": {"core", "analyses", "charts", "app", "torch", "streamlit", "altair"} | SHARED,
    "cli": {"core", "analyses", "charts", "cli", "app.launch", "torch"} | SHARED,
    "plot": {"core", "analyses", "charts", "torch", "altair"} | SHARED,
    # app.py and views/*.py: the dashboard's scripts reach the library through the app, the tables and charts, and
    # cwviz's top-level names (its errors); never the rest of the core, torch or transformers.
    "views": {"top", "app", "analyses", "charts", "streamlit", "altair"} | SHARED,
}
#: The modules that are rooms of their own inside a larger one, with stricter rules than it.
SPECIAL = ("analyses.schema", "app.launch", "core.util.errors", "core.vocabulary", "core.defaults")
#: Imports outside the rules, each with its reason.
EXCEPTIONS = {
    ("cwviz.core.loading.provenance", "top"): "a results manifest records the package's version (cwviz.__version__)",
}
TRACKED = ("torch", "transformers", "streamlit", "altair")
#: The most lines a module of cwviz may have: one module, one job.
MAX_MODULE_LINES = 450
#: The most lines a function or method of cwviz, app.py, the pages and the benchmarks may have: one idea.
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    """``cwviz/core/method/analysis.py`` -> ``cwviz.core.method.analysis``; ``cwviz/core/__init__.py`` ->
    ``cwviz.core``."""
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
    """The module of cwviz an imported name lies in (``cwviz.core.method.measures.KINDS`` ->
    ``cwviz.core.method.measures``)."""
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
        for special in SPECIAL:
            if rest == special or rest.startswith(special + "."):
                return special
        return rest.split(".")[0]
    return parts[0] if parts[0] in TRACKED else None


def _check(module: str, room: str, names: set[str]) -> list[str]:
    wrong = []
    for name in sorted(names):
        target = _room_of(name)
        if target is None or target in ROOMS[room] or target.split(".")[0] in ROOMS[room]:
            continue  # a parent room's permission covers its special modules (SPECIAL) too
        if (module, target) not in EXCEPTIONS:
            wrong.append(f"{module} imports {name}")
    return wrong


def test_rooms_import_only_what_they_may():
    """core knows nothing above it; charts see only the torch-free table types; only the app imports Streamlit;
    the table types import nothing of cwviz but the shared words; the pages never reach into the core."""
    wrong = []
    for module, path in CWVIZ_MODULES.items():
        own = [special for special in SPECIAL if module == f"cwviz.{special}" and special in ROOMS]
        room = own[0] if own else module.split(".")[1] if "." in module else None
        if room not in ROOMS:
            continue  # cwviz/__init__.py (lazy names) and __main__.py
        wrong += _check(module, room, _imports(path, module))
    for path in SCRIPTS:
        wrong += _check(str(path.relative_to(ROOT)), "views", _imports(path, "__main__"))
    assert not wrong, "imports across the rooms of docs/ARCHITECTURE.md:\n" + "\n".join(wrong)


def _core_imports(module: str) -> set[str]:
    """The modules of cwviz.core that ``module`` imports (anywhere in its body)."""
    found = {_cwviz_module(name) for name in _imports(CWVIZ_MODULES[module], module)}
    return {m for m in found if m and m.startswith("cwviz.core.") and m != module}


def test_the_wings_of_core_import_down_only():
    """The wings of the core (docs/ARCHITECTURE.md, "The rooms"): ``core.util`` imports nothing of ``core.method`` or
    ``core.loading``; where ``core.loading`` meets the method (the seam's name it registers, the Gram matrix), the
    modules of ``core.method`` it reaches, and everything they import in turn, import nothing of ``core.loading``:
    the one way between the two wings."""
    wrong = []
    for module in CWVIZ_MODULES:
        if module.startswith("cwviz.core.util."):
            wrong += [
                f"{module} imports {m}" for m in sorted(_core_imports(module)) if not m.startswith("cwviz.core.util")
            ]
    reached = {m for module in CWVIZ_MODULES if module.startswith("cwviz.core.loading.") for m in _core_imports(module)}
    todo = sorted(m for m in reached if m.startswith("cwviz.core.method."))
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for target in sorted(_core_imports(module)):
            if target.startswith("cwviz.core.loading"):
                wrong.append(f"{module} (reached from core.loading) imports {target}")
            elif target.startswith("cwviz.core.method."):
                todo.append(target)
    assert not wrong, "imports against the wings of core:\n" + "\n".join(wrong)


def _tree_modules() -> dict[str, Path]:
    """Every Python module of the repository by its dotted name: cwviz, ``app`` (app.py), ``views.flow``, the
    benchmarks, the tests and their helpers, the site's hooks (``docs.hooks.cwviz_docs``)."""
    paths = [ROOT / "app.py"]
    for folder in ("cwviz", "views", "benchmarks", "tests", "docs"):
        paths += [p for p in sorted((ROOT / folder).rglob("*.py")) if "artifacts" not in p.relative_to(ROOT).parts]
    return {_module_name(path): path for path in paths}


TREE_MODULES = _tree_modules()


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module -> the modules of ``modules`` it imports anywhere in its body (inside functions and under
    ``if TYPE_CHECKING:`` too). An imported name counts as the module it lies in (``cwviz.core.method.measures.KINDS``
    -> ``cwviz.core.method.measures``); a package's ``__init__`` does not count as imported along with its modules."""
    graph = {}
    for module, path in modules.items():
        found = set()
        for name in _imports(path, module):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
        graph[module] = found
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """One cycle through each import cycle of ``graph``, as ``a -> b -> a``."""
    done: set[str] = set()
    cycles = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.add(" -> ".join(path[path.index(module) :] + [module]))
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return sorted(cycles)


def test_the_import_graph_of_the_tree_has_no_cycle():
    """Every import of every module of the repository (cwviz, app.py, the pages, the benchmarks, the tests and their
    helpers), those inside functions included: a module that needs a function-level import to dodge a cycle is telling
    us where the helper really lives (docs/ARCHITECTURE.md, "The order")."""
    cycles = _cycles(_import_graph(TREE_MODULES))
    assert not cycles, "import cycles (move the piece both sides need into a module of its own):\n" + "\n".join(cycles)


def _levels(graph: dict[str, set[str]]) -> list[list[str]]:
    """The order of a graph without cycles, in levels: level 0 imports nothing of the graph, level n imports something
    of level n - 1 and nothing of a later level."""
    level: dict[str, int] = {}

    def of(node: str) -> int:
        if node not in level:
            level[node] = 1 + max((of(target) for target in graph[node]), default=-1)
        return level[node]

    for node in graph:
        of(node)
    return [sorted(n for n in graph if level[n] == i) for i in range(max(level.values(), default=-1) + 1)]


def _order_room(module: str) -> str | None:
    """The room a module of the tree stands in for the order of the rooms: ``cwviz.charts.token`` -> ``charts``, a
    room's own modules (``analyses.schema``, ``app.launch``) with it, app.py and the pages -> ``views``; None for the
    top level (lazy names of every room), ``cwviz.__main__`` and the tests."""
    parts = module.split(".")
    if module == "app" or parts[0] == "views":
        return "views"
    if parts[0] == "benchmarks":
        return "benchmarks"
    if parts[0] != "cwviz" or len(parts) < 2 or parts[1] == "__main__":
        return None
    return parts[1]


def _room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in _import_graph(TREE_MODULES).items():
        if (room := _order_room(module)) is not None:
            rooms = {_order_room(target) for target in targets} - {None, room}
            graph.setdefault(room, set()).update(rooms)
    return graph


def _core_graph() -> dict[str, set[str]]:
    """The modules of cwviz.core (named from it: ``method.capture``) and what each imports of them; the packages'
    ``__init__`` (docstrings only) left out."""

    def short(module: str) -> str:
        return module.removeprefix("cwviz.").removeprefix("core.")

    core = {m: path for m, path in CWVIZ_MODULES.items() if m.startswith("cwviz.core.") and path.name != "__init__.py"}
    return {short(module): {short(target) for target in targets} for module, targets in _import_graph(core).items()}


def _written_order(heading: str) -> list[list[str]]:
    """The levels docs/ARCHITECTURE.md writes under ``heading``: the first ``text`` block after it, a level a line
    (an indented line goes on with the level above), names separated by ``·``."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert heading in text, f"docs/ARCHITECTURE.md has no heading {heading!r}"
    block = text.split(heading, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    levels: list[str] = []
    for line in block.splitlines():
        if line.startswith((" ", "·")) and levels:
            levels[-1] += " · " + line.strip().removeprefix("·")
        elif line.strip():
            levels.append(line)
    return [[name.strip() for name in level.split("·") if name.strip()] for level in levels]


def _disagreements(written: list[list[str]], graph: dict[str, set[str]]) -> list[str]:
    """Where a written order is not an order of ``graph``: a name missing or written twice, a name unknown, an import
    of a name on the same line or a later one."""
    line_of = {}
    wrong = []
    for number, names in enumerate(written):
        for name in names:
            if name in line_of:
                wrong.append(f"{name} is written twice")
            line_of[name] = number
    wrong += [f"{name} is not written" for name in sorted(set(graph) - set(line_of))]
    wrong += [f"{name} is written but is no module" for name in sorted(set(line_of) - set(graph))]
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if name in line_of and target in line_of and line_of[target] >= line_of[name]:
                wrong.append(f"{name} imports {target}, which is not written above it")
    return wrong


def _show(levels: list[list[str]], width: int = 116) -> str:
    """Levels as docs/ARCHITECTURE.md writes them: a level a line, a long one wrapped onto indented lines."""
    lines = []
    for names in levels:
        lines.append(names[0])
        for name in names[1:]:
            if len(lines[-1]) + len(name) + 3 > width:
                lines.append("    · " + name)
            else:
                lines[-1] += " · " + name
    return "\n".join(lines)


def test_the_order_docs_architecture_writes_is_the_import_order():
    """docs/ARCHITECTURE.md, "The order": the rooms, and the modules of the core, a level a line, each importing only
    what is written above it. Prints the order the import graph gives (``pytest -s`` or ``-rA``), levels as the
    document writes them, so that a new module or import is written in by copying it."""
    rooms, core = _room_graph(), _core_graph()
    print("The order of the rooms:", _show(_levels(rooms)), "", "The order of core:", _show(_levels(core)), sep="\n")
    wrong = [f"rooms: {w}" for w in _disagreements(_written_order("### The rooms, in order"), rooms)]
    wrong += [f"core: {w}" for w in _disagreements(_written_order("### The modules of core, in order"), core)]
    assert not wrong, (
        "docs/ARCHITECTURE.md's order disagrees with the imports:\n"
        + "\n".join(wrong)
        + f"\n\nthe rooms, in order:\n{_show(_levels(rooms))}\n\nthe modules of core, in order:\n{_show(_levels(core))}"
    )


def test_the_rooms_docs_architecture_writes_are_the_rooms_the_test_checks():
    """docs/ARCHITECTURE.md's table "What may import what" is :data:`ROOMS`, and its list of torch-free modules is
    :data:`TORCH_FREE`: what the document says is what the tests hold the code to."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## What may import what", 1)[1].split("\n## ", 1)[0]
    written: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[0].startswith("`"):
            room = "views" if cells[0].startswith("`app.py`") else cells[0].strip("`")
            names = {name.strip().strip("`") for name in cells[1].split(",")} - {""}
            written[room] = {"top" if name == "cwviz" else name for name in names}
    differ = [
        f"{room}: the document {sorted(written.get(room, ()))}, ROOMS {sorted(ROOMS.get(room, ()))}"
        for room in sorted(written.keys() | ROOMS.keys())
        if written.get(room) != ROOMS.get(room)
    ]
    assert not differ, "docs/ARCHITECTURE.md's table of rooms is not ROOMS:\n" + "\n".join(differ)
    free = section.split("Torch-free:", 1)[1].split("\n\n", 1)[0]
    named, checked = set(free.split("`")[1::2]), {m for m in TORCH_FREE if not m.startswith("cwviz.charts.")}
    assert named == checked, (
        f"torch-free in the document only: {named - checked}; in TORCH_FREE only: {checked - named}"
    )


def _function_lengths(path: Path) -> list[tuple[str, int]]:
    """Each function and method of a module with its length in lines, from ``def`` to its last line (its docstring
    included, its decorators not); a nested function counts in its own right and in its parent's."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def test_only_the_services_cache():
    """The app's services are the only Streamlit caching."""
    caching = [
        str(path.relative_to(ROOT))
        for path in [*CWVIZ_MODULES.values(), *SCRIPTS]
        if "st.cache_" in path.read_text(encoding="utf-8") and not path.stem.endswith("services")
    ]
    assert not caching, f"Streamlit caching outside cwviz.app's services: {caching}"


def test_no_module_of_cwviz_is_over_the_limit():
    """One module, one job: none of cwviz over :data:`MAX_MODULE_LINES` lines (``cwviz.core.method.analysis``, the
    largest of the core, included)."""
    assert "cwviz.core.method.analysis" in CWVIZ_MODULES
    long = {}
    for module, path in CWVIZ_MODULES.items():
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES:
            long[module] = lines
    listed = "\n".join(f"{module}: {lines} lines" for module, lines in sorted(long.items(), key=lambda kv: -kv[1]))
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job):\n{listed}"


def test_no_function_is_over_the_limit():
    """One function, one idea: no function or method of cwviz, app.py, the pages or the benchmarks over
    :data:`MAX_FUNCTION_LINES` lines."""
    paths = [*CWVIZ_MODULES.values(), *SCRIPTS, *sorted((ROOT / "benchmarks").glob("*.py"))]
    long = [
        (lines, f"{path.relative_to(ROOT)}: {name}")
        for path in paths
        for name, lines in _function_lengths(path)
        if lines > MAX_FUNCTION_LINES
    ]
    listed = "\n".join(f"{where}: {lines} lines" for lines, where in sorted(long, reverse=True))
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (one idea a function):\n{listed}"


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
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif (
            isinstance(node, ast.ImportFrom) and not node.level and node.module and node.module.split(".")[0] != "cwviz"
        ):
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
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
                and node.args
            ):
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
    assert seen == set(SWAPS), (
        f"SWAPS lists swaps that are gone (remove them, and their pinning test): {set(SWAPS) - seen}"
    )


def test_only_the_core_reads_an_analysis_layer_records():
    """Outside the core, an analysis is read through its public methods (``key_mask``, ``values``, ``row_blocks``,
    ``layer_record`` ...), never through its private ``_layer_records``: on a prompt whose records are on disk,
    ``_layer_records[layer]`` reads back a whole layer to learn what the methods give without it. ("records" alone are a
    sweep's results.)"""
    core = (ROOT / "cwviz" / "core", ROOT / "tests" / "core")
    wrong = []
    for path in sorted(ROOT.glob("**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in ("cwviz", "views", "benchmarks", "tests", "app.py") or any(
            path.is_relative_to(c) for c in core
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "_layer_records":
                wrong.append(f"{rel}:{node.lineno}: ._layer_records")
    assert not wrong, "an analysis's layer records read outside cwviz.core (use the Analysis methods):\n" + "\n".join(
        wrong
    )


#: What computes one item of a run: called in a loop, they make the loop a run of its own.
PER_ITEM = {"make_record", "analyze", "run_example", "run_item", "item_payload", "prompt_stats"}
#: The per-item generators of the Python API (one item's step, for a notebook): outside the runner they are called
#: with a one-item list, as a ``compute(index)`` calls them.
ITEM_STEPS = {"iter_examples", "iter_items", "iter_prompt_stats"}
#: The runner, the only module that loops over a run's items.
RUNNER = "cwviz/analyses/sweep.py"
#: Loops over the parts of ONE item (not over a run's items), each with its reason; and the per-item generators'
#: own loops.
ONE_ITEM = {
    ("cwviz/analyses/tasks.py", "run_item"): "a multiple-choice item's choices, one pass each",
    ("cwviz/analyses/claim_runs.py", "item_payload"): "one item's rank scopes, from its one clean pass",
    ("cwviz/cli/compare.py", "analyse_inputs"): "the two inputs A and B of one comparison",
    ("cwviz/analyses/faithfulness.py", "iter_examples"): "the per-item generator's own loop",
    ("cwviz/analyses/tasks.py", "iter_items"): "the per-item generator's own loop",
    ("cwviz/analyses/atlas.py", "iter_prompt_stats"): "the per-item generator's own loop",
}


def _called(node: ast.AST) -> str | None:
    func = node.func if isinstance(node, ast.Call) else None
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _catches_ctrl_c(handler: ast.ExceptHandler) -> bool:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(c, ast.Name) and c.id == "KeyboardInterrupt" for c in caught)


def _loops(tree: ast.AST):
    """Each ``for`` loop and comprehension, with the expressions it runs per turn and its enclosing function's name."""

    def visit(node: ast.AST, function: str | None):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, (ast.For, ast.AsyncFor)):
                yield child, [child.iter, *child.body], inner
            elif isinstance(child, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
                turn = [child.key, child.value] if isinstance(child, ast.DictComp) else [child.elt]
                yield child, [g.iter for g in child.generators] + turn, inner
            yield from visit(child, inner)

    yield from visit(tree, None)


def test_only_the_runner_loops_over_a_run_s_items():
    """One runner for every job over many items (cwviz.analyses.sweep.run): it owns order, resume, progress and cancel.
    The rule, on the code of cwviz, app.py and the pages (the runner itself aside): (1) no ``for`` loop or comprehension
    calls what computes one item (:data:`PER_ITEM`: making a record, a forward pass, an example's or an item's runs, a
    prompt's statistics), except the loops over the parts of one item listed in :data:`ONE_ITEM`; (2) a per-item
    generator (:data:`ITEM_STEPS`) is given a one-item list, as a runner's ``compute(index)`` gives it; (3) no ``try``
    around a loop catches KeyboardInterrupt (keeping a run's finished items on Ctrl-C is the runner's)."""
    wrong = []
    for path in [*CWVIZ_MODULES.values(), *SCRIPTS]:
        where = path.relative_to(ROOT).as_posix()
        if where == RUNNER:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for loop, turn, function in _loops(tree):
            if (where, function) in ONE_ITEM:
                continue
            called = {_called(node) for part in turn for node in ast.walk(part)} & (PER_ITEM | ITEM_STEPS)
            wrong += [
                f"{where}:{loop.lineno}: a loop calls {name} (in {function or 'the module'})" for name in sorted(called)
            ]
        for node in ast.walk(tree):
            if _called(node) in ITEM_STEPS:
                items = node.args[1] if len(node.args) > 1 else None
                if not (isinstance(items, ast.List) and len(items.elts) == 1):
                    wrong.append(f"{where}:{node.lineno}: {_called(node)} is given more than one item")
            if isinstance(node, ast.Try) and any(_catches_ctrl_c(h) for h in node.handlers):
                if any(isinstance(n, (ast.For, ast.AsyncFor)) for part in node.body for n in ast.walk(part)):
                    wrong.append(f"{where}:{node.lineno}: a loop keeps its finished items on Ctrl-C itself")
    assert not wrong, "loops over a run's items outside the runner (give the runner a compute(index)):\n" + "\n".join(
        wrong
    )


def test_top_level_names():
    from cwviz import analyze, decomposition, faithfulness, load_model, sinks, to_dict, to_json
    from cwviz.analyses import faithfulness as faithfulness_module
    from cwviz.analyses import sinks as sinks_module
    from cwviz.analyses import tables
    from cwviz.core.loading.models import load_model as core_load_model
    from cwviz.core.method import export
    from cwviz.core.method.analysis import analyze as core_analyze

    assert (analyze, load_model, sinks, faithfulness) == (
        core_analyze,
        core_load_model,
        sinks_module,
        faithfulness_module,
    )
    assert (decomposition, to_dict, to_json) == (tables.decomposition, export.to_dict, export.to_json)


# Built from pieces so that this file does not match itself.
OUTSIDE = ("..", "/shared")
MACHINE = ("/wo", "rk/")


def _tracked_text_files() -> list[Path]:
    """Files git tracks (every file under the root, minus build outputs, where this is not a git checkout)."""
    try:
        listed = (
            subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=ROOT, check=True)
            .stdout.decode()
            .split("\0")
        )
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
    assert not found, (
        "paths outside the repository (use a path inside it, an option or an environment variable):\n"
        + "\n".join(found)
    )


def _test_module_in(name: str) -> str | None:
    """The test module (``test_*.py``) or conftest.py an imported name lies in, if any: ``tests.app.test_app.widget``
    -> ``tests/app/test_app.py``."""
    parts = name.split(".")
    for end in range(2, len(parts) + 1):
        path = ROOT.joinpath(*parts[:end]).with_suffix(".py")
        if path.is_file() and (path.name.startswith("test_") or path.name == "conftest.py"):
            return path.relative_to(ROOT).as_posix()
    return None


def test_no_test_module_imports_another_test_module_or_a_conftest():
    """Tests share helpers through tests/helpers and fixtures through conftest.py files: importing a test module
    runs its setup and ties two files of tests together, and pytest loads a conftest.py itself (imported as well,
    it can run twice)."""
    wrong = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        module = _module_name(path)
        for name in sorted(_imports(path, module)):
            found = _test_module_in(name) if name.startswith("tests.") else None
            if found is not None:
                wrong.append(f"{path.relative_to(ROOT)} imports {name} ({found})")
    assert not wrong, "\n".join(wrong)
