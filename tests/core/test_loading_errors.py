"""The model-loading edge (issue 34): a bad device, model file, model folder or environment variable gives, in the CLI,
exit status 2 and one ``error:`` line naming what to change, and in the Python API a CwvizError subclass, checked
before a model is converted or loaded. Ctrl-C during start-up ends with status 130 and one line."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import cwviz
from cwviz.cli import main
from cwviz.core.loading import checkpoints
from cwviz.core.util import parallel
from cwviz.core.util.errors import InputError, ModelLoadError
from cwviz.core.util.settings import LAUNCHER_VARIABLES
from tests.helpers import default_signals, family_model, save_with_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A tiny llama saved with a tokenizer: a folder that loads."""
    return Path(save_with_tokenizer(family_model("llama"), tmp_path_factory.mktemp("good")))


def broken_copy(good: Path, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(good, folder)
    edit(folder)
    return folder


def cli_error(args, capsys) -> str:
    """Run ``cwviz ARGS``; assert exit status 2, exactly one ``error:`` line and no traceback; return that line."""
    code = main(args)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def analyze_args(model) -> list[str]:
    return ["analyze", "--model", str(model), "--text", "hello there", "--device", "cpu"]


@pytest.fixture(autouse=True)
def offline_cache(tmp_path, monkeypatch):
    """Nothing reaches the hub, and conversions go to a cache of the test's own."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path / "cache"))
    for name in ("CWVIZ_MEMORY_BYTES", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


# -- devices -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["meta", "mps", "cuda"])
def test_a_device_this_machine_lacks_is_refused_before_loading(device, good, capsys):
    if device == "mps" and torch.backends.mps.is_available() or device == "cuda" and torch.cuda.is_available():
        pytest.skip(f"this machine has {device}")
    with pytest.raises(ModelLoadError, match=f"device '{device}'.*choose device"):
        cwviz.load_model(str(good), device=device)
    line = cli_error([*analyze_args(good)[:-1], device], capsys)
    assert f"device '{device}'" in line and "choose device" in line


# -- model files and folders ---------------------------------------------------------------------------------------
def gguf_cases(tmp_path: Path) -> dict[str, Path]:
    four = tmp_path / "four.gguf"
    four.write_bytes(b"GGUF")
    cut = tmp_path / "cut.gguf"  # the SmolLM2 GGUF cut inside its vocabulary: struct.error in the header's parse
    weights = tmp_path / "weights.gguf"  # cut inside its first tensor (its header ends at 1.79 MB): gguf's own parse
    with open(checkpoints.embedded_gguf(), "rb") as f:
        head = f.read(2_000_000)
    cut.write_bytes(head[:100_000])
    weights.write_bytes(head)
    return {"4 bytes": four, "truncated": cut, "cut in its weights": weights}


@pytest.mark.parametrize("case", ["4 bytes", "truncated", "cut in its weights"])
def test_a_broken_gguf_is_one_error(case, tmp_path, capsys):
    path = gguf_cases(tmp_path)[case]
    with pytest.raises(ModelLoadError, match=f"{path.name}.*(not a GGUF file|truncated)"):
        cwviz.load_model(str(path), device="cpu")
    line = cli_error(analyze_args(path), capsys)
    assert path.name in line and ("not a GGUF file" in line or "download it again" in line)
    assert not list((tmp_path / "cache").glob("models/gguf-*"))  # no half-written cache folder is left
    # ... and the gguf module is as it was: its reader class (checkpoints.parsed_once swaps it during a conversion)
    assert gguf.GGUFReader is gguf.gguf_reader.GGUFReader and gguf.gguf_reader.np is np


def _cut_weights(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _garbage_weights(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"not safetensors " * 64)


def _zero_heads(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_attention_heads": 0}))


def _remote_code(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "mystery", "auto_map": {"AutoConfig": "configuration_mystery.MysteryConfig"}}
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_cut_weights, r"model.safetensors is damaged or truncated"),
        (_garbage_weights, r"model.safetensors is damaged or truncated"),
        (_zero_heads, r"config.json has num_attention_heads: 0; it must be a whole number of at least 1"),
        (_remote_code, r"needs Python code shipped with the model.*pass --trust-remote-code"),
    ],
)
def test_a_broken_model_folder_is_one_error(edit, message, good, tmp_path, capsys):
    folder = broken_copy(good, tmp_path, edit)
    with pytest.raises(ModelLoadError, match=message):
        cwviz.load_model(str(folder), device="cpu")
    line = cli_error(analyze_args(folder), capsys)
    assert re.search(message, line), line
    assert "https://" not in line and "trust_remote_code=True`" not in line  # no URL made of a local path


def test_a_safetensors_file_asks_for_its_folder(good, capsys):
    weights = good / "model.safetensors"
    with pytest.raises(ModelLoadError, match="holds weights only; give the folder"):
        cwviz.load_model(str(weights), device="cpu")
    line = cli_error(analyze_args(weights), capsys)
    assert "does not exist" not in line and "config.json" in line


# -- environment variables ---------------------------------------------------------------------------------------
def test_a_cache_that_is_a_file_is_named_before_anything_is_converted(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache-file"
    cache.write_text("not a folder")
    monkeypatch.setenv("CWVIZ_CACHE", str(cache))

    def no_conversion(*_):
        raise AssertionError("nothing may be converted into a cache that is a file")

    monkeypatch.setattr(checkpoints, "convert_gguf", no_conversion)
    with pytest.raises(InputError, match="CWVIZ_CACHE is .*not a folder"):
        cwviz.load_model("embedded", device="cpu")
    assert "CWVIZ_CACHE" in cli_error(analyze_args("embedded"), capsys)


def test_memory_bytes_that_are_not_a_number_are_named(good, monkeypatch, capsys):
    monkeypatch.setenv("CWVIZ_MEMORY_BYTES", "abc")
    with pytest.raises(InputError, match="CWVIZ_MEMORY_BYTES must be a number of bytes"):
        cwviz.load_model(str(good), device="cpu")
    assert "CWVIZ_MEMORY_BYTES" in cli_error(analyze_args(good), capsys)


@pytest.mark.parametrize(
    ("value", "message"), [("abc", "WORLD_SIZE must be a whole number"), ("2", "WORLD_SIZE is 2 but .*torchrun")]
)
def test_a_world_size_no_launcher_set_is_refused(value, message, good, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", value)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InputError, match=message):
        parallel.processes("cpu")
    line = cli_error(["faithfulness", "--model", str(good), "--text", "hello there", "--device", "cpu"], capsys)
    assert "WORLD_SIZE" in line


# -- Ctrl-C during start-up --------------------------------------------------------------------------------------
def test_ctrl_c_while_starting_is_one_line_and_status_130(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(sys.modules["cwviz.cli.main"], "build_parser", interrupted)  # the module, not the function
    assert main(["analyze", "--text", "hi"]) == 130
    assert capsys.readouterr().err.splitlines() == ["interrupted"]


def test_ctrl_c_while_the_command_imports_torch_is_quiet():
    """The real thing: SIGINT at three moments while torch and transformers import (several seconds). A
    KeyboardInterrupt raised inside torch's C++ import code could abort the process (status -6, seen once under
    load) or leave it killed by the signal (-2); each try must end with one line and status 130."""
    for delay in (0.5, 1.0, 2.0):
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "cwviz", "analyze", "--text", "hi"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_signals,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and err.splitlines() == ["interrupted"], (delay, time.monotonic() - started, err)
