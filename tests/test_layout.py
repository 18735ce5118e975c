"""The layout is the architecture (docs/ARCHITECTURE.md): the charts room and the table types stay free of
torch and transformers, the top-level names keep working, and no tracked file points outside the repository."""

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
TORCH_FREE = ["cwviz.charts", *(f"cwviz.charts.{m.name}" for m in pkgutil.iter_modules([str(CHARTS_DIR)])), "cwviz.analyses.schema"]


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


#: What each room may import (cwviz rooms and the heavy third-party packages; docs/ARCHITECTURE.md, "Rooms").
ROOMS: dict[str, set[str]] = {
    "core": {"core", "torch", "transformers"},
    "analyses": {"core", "analyses", "torch"},
    "charts": {"charts", "analyses.schema", "altair"},
    "app": {"core", "analyses", "charts", "app", "torch", "streamlit", "altair"},
    "cli": {"core", "analyses", "charts", "cli", "app.launch", "torch"},
    "plot": {"core", "analyses", "charts", "torch", "altair"},
}
#: Imports outside the rules, each with its reason.
EXCEPTIONS = {
    ("cwviz.cli.main", "transformers"): "quiets transformers' progress bars and logging before a command prints",
    ("cwviz.core.parallel", "__version__"): "a results manifest records the package's version",
}
TRACKED = ("torch", "transformers", "streamlit", "altair")


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of what ``module`` (at ``path``) imports anywhere in its body, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names |= {base} if node.module else {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module)
    return names


def _room_of(name: str) -> str | None:
    """``cwviz.charts.token`` -> ``charts``; ``torch.nn`` -> ``torch``; None for what no rule covers."""
    parts = name.split(".")
    if parts[0] == "cwviz":
        if len(parts) == 1:
            return None
        rest = ".".join(parts[1:])
        return "analyses.schema" if rest.startswith("analyses.schema") else "app.launch" if rest.startswith("app.launch") else parts[1]
    return parts[0] if parts[0] in TRACKED else None


def test_rooms_import_only_what_they_may():
    """core knows nothing above it; charts see only the torch-free table types; only the app imports Streamlit."""
    wrong = []
    for path in sorted((ROOT / "cwviz").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        room = module.split(".")[1] if "." in module else None
        if room not in ROOMS:
            continue  # cwviz/__init__.py (lazy names) and __main__.py
        for name in sorted(_imports(path, module)):
            target = _room_of(name)
            if target is None or target in ROOMS[room] or target.split(".")[0] in ROOMS[room]:
                continue  # a parent room's permission covers analyses.schema and app.launch too
            if (module, target) not in EXCEPTIONS:
                wrong.append(f"{module} imports {name}")
    assert not wrong, "imports across the rooms of docs/ARCHITECTURE.md:\n" + "\n".join(wrong)


def test_top_level_names():
    from cwviz import analyze, faithfulness, load_model, sinks
    from cwviz.analyses import faithfulness as faithfulness_module
    from cwviz.analyses import sinks as sinks_module
    from cwviz.core.analysis import analyze as core_analyze
    from cwviz.core.models import load_model as core_load_model

    assert (analyze, load_model, sinks, faithfulness) == (core_analyze, core_load_model, sinks_module, faithfulness_module)


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
