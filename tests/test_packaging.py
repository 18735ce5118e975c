"""cwviz as a package: the wheel installs into a fresh virtual environment and runs outside the checkout.

The wheel is built from this checkout (``pip wheel --no-build-isolation``: no download of the build
backend) and installed with ``--no-deps --no-index`` into a new venv whose dependencies come from the
test environment through a ``.pth`` file: nothing is fetched, and ``import cwviz`` in that venv can only
find the installed wheel (a ``.pth`` file inside a ``.pth``-added folder, such as an editable install's,
is not read). Every command runs from a temporary folder that is not the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import cwviz
from cwviz.app import launch

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        cwd=out,
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("cwviz-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; its dependencies are the test environment's (via .pth)."""
    folder = tmp_path_factory.mktemp("venv")
    assert _run([sys.executable, "-m", "venv", str(folder)], cwd=folder).returncode == 0
    python = folder / "bin" / "python"
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=folder
    ).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "_cwviz_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n", encoding="utf-8")
    done = _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder


def test_the_wheel_carries_the_dashboard_the_examples_the_flow_test_and_the_gsm8k_sample(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "cwviz/_dashboard/app.py",
        "cwviz/_dashboard/views/heatmaps.py",
        "cwviz/_dashboard/.streamlit/config.toml",
        "cwviz/app/examples.json",
        "cwviz/app/flow_test.csv",  # the Flow page's sentence on how faithful the shown method was in the test
        "cwviz/_data/gsm8k/sample.jsonl",
        "cwviz/_data/gsm8k/LICENSE",
    ):
        assert name in names, name
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)


def test_the_wheel_metadata_names_the_version_the_command_the_dependencies_and_extras(wheel):
    archive = zipfile.ZipFile(wheel)
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    text = archive.read(metadata).decode()
    assert f"Version: {cwviz.__version__}" in text
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    for package in ("torch", "transformers", "pandas", "gguf"):
        assert any(line.split()[1].startswith(package) for line in requires), package
    assert any("streamlit" in line and "extra == 'app'" in line for line in requires)
    assert {"Provides-Extra: app", "Provides-Extra: test", "Provides-Extra: dev"} <= set(text.splitlines())
    (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "cwviz = cwviz.cli:main" in archive.read(entry_points).decode()


def test_installed_cwviz_analyses_from_another_folder(venv, tmp_path):
    where = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import cwviz, json; print(json.dumps([cwviz.__file__, cwviz.__version__]))",
        ],
        cwd=tmp_path,
    )
    path, version = json.loads(where.stdout)
    assert Path(path).is_relative_to(venv) and version == cwviz.__version__
    out = tmp_path / "analysis.json"
    done = _run(
        [str(venv / "bin" / "cwviz"), "analyze", "--text", "The capital of France is", "--json", str(out)], cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["tokens"][-1].strip() == "is" and len(data["layers"]) == 30
    bad = _run(
        [str(venv / "bin" / "cwviz"), "analyze", "--model", str(tmp_path / "nowhere"), "--text", "x"], cwd=tmp_path
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_installed_dashboard_runs_from_its_packaged_files(venv, tmp_path):
    """The app's files come from the wheel (not the checkout) and every page runs in AppTest there."""
    script = """
import json
from streamlit.testing.v1 import AppTest
from cwviz.app import launch
folder = launch.dashboard_dir()
at = AppTest.from_file(str(folder / "app.py"), default_timeout=240)
at.run()
seen = {"folder": str(folder), "exceptions": [e.value for e in at.exception], "charts": len(at.get("vega_lite_chart"))}
print(json.dumps(seen))
"""
    done = _run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(seen["folder"]).is_relative_to(venv)
    assert seen["exceptions"] == [] and seen["charts"] >= 2


def test_in_a_checkout_the_dashboard_is_the_checkouts_own():
    assert launch.dashboard_dir() == ROOT


def test_cwviz_app_passes_the_shipped_config_then_the_users_options():
    command = launch.command(["--server.port", "8765"])
    assert command[:4] == [sys.executable, "-m", "streamlit", "run"] and command[4] == str(ROOT / "app.py")
    assert "--server.showEmailPrompt=false" in command and "--browser.gatherUsageStats=false" in command
    assert command[-2:] == ["--server.port", "8765"]  # after the shipped options, so the user's win


def test_cwviz_app_without_streamlit_says_which_extra_to_install(monkeypatch, capsys):
    from cwviz.cli import main

    real = launch.importlib.util.find_spec
    monkeypatch.setattr(
        launch.importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a)
    )
    assert main(["app"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "cwviz[app]" in err[0]


def test_cwviz_app_hands_every_option_to_streamlit(monkeypatch):
    """`cwviz app --server.port 8502 --server.headless true` (options first, as the help says) reach
    `streamlit run` in order; `cwviz app -h` is cwviz's own help."""
    from cwviz.cli.main import main

    seen = []
    monkeypatch.setattr(launch, "run", lambda extra=None: seen.append(extra) or 0)
    assert main(["app", "--server.port", "8502", "--server.headless", "true"]) == 0
    assert main(["-v", "app", "--server.port=8503"]) == 0
    assert seen == [["--server.port", "8502", "--server.headless", "true"], ["--server.port=8503"]]
    with pytest.raises(SystemExit) as exit_:
        main(["app", "-h"])
    assert exit_.value.code == 0
