"""``cwviz app``: find the dashboard's files and start Streamlit on them.

The dashboard is ``app.py`` and ``views/`` at the top of the repository (``streamlit run app.py``
works in a checkout). A wheel carries the same files inside the package, as ``cwviz/_dashboard``
(pyproject.toml, ``force-include``), so an installed cwviz runs the app from any folder.

Streamlit reads ``.streamlit/config.toml`` from the working folder only, so the shipped config is
passed on the command line instead (``--section.option=value``); options given after ``cwviz app``
are passed on after it and so win.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from ..core.util.errors import CwvizError
from ..core.util.heap import tune_heap

PACKAGE = Path(__file__).resolve().parent.parent


def dashboard_dir() -> Path:
    """The folder holding ``app.py``, ``views/`` and ``.streamlit/config.toml``: the wheel's copy, else the checkout."""
    for folder in (PACKAGE / "_dashboard", PACKAGE.parent):
        if (folder / "app.py").is_file() and (folder / "views").is_dir():
            return folder
    raise CwvizError(
        f"the dashboard files (app.py, views/) are not beside {PACKAGE}: reinstall cwviz ('pip install \"cwviz[app]\"')"
    )


def config_flags(config: Path) -> list[str]:
    """``.streamlit/config.toml`` as ``streamlit run`` flags (``--server.port=8501``); none when the file is missing."""
    if not config.is_file():
        return []
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    flags = []
    for section, options in tomllib.loads(config.read_text(encoding="utf-8")).items():
        for name, value in options.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            flags.append(f"--{section}.{name}={text}")
    return flags


def start_server() -> None:
    """What the dashboard's server sets for its own process, from ``app.py``: it owns the process, so its heap keeps
    the row blocks' buffers (:func:`cwviz.core.util.heap.tune_heap`; once, whatever the reruns)."""
    tune_heap()


def command(extra: list[str] | None = None) -> list[str]:
    """The ``python -m streamlit run .../app.py --...`` command line ``cwviz app`` runs."""
    folder = dashboard_dir()
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(folder / "app.py"),
        *config_flags(folder / ".streamlit" / "config.toml"),
        *(extra or []),
    ]


def run(extra: list[str] | None = None) -> int:
    """Start the dashboard and wait for it (Ctrl-C or SIGTERM stops it, and the server with it); the exit
    status is Streamlit's."""
    if importlib.util.find_spec("streamlit") is None:
        raise CwvizError('the dashboard needs the app extra: pip install "cwviz[app]"')
    server = subprocess.Popen(command(extra))
    try:
        return server.wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cwviz.cli.main): stop the server too, not only this process
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        return 130
