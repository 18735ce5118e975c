"""Caches that prove themselves (issue 58): a converted model records its files' sizes and SHA-256; a load that finds
a file cut or changed says so in one line and converts again; a full disk during conversion is one error naming
CWVIZ_CACHE and the space needed, with no partial file left. On a tiny GGUF (:func:`tests.helpers.write_tiny_gguf`),
converted into a CWVIZ_CACHE of the test's own."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from safetensors import SafetensorError

import cwviz
from cwviz.core.loading import cache_records, checkpoints
from cwviz.core.util.errors import ModelLoadError
from tests.helpers import call, write_tiny_gguf


@pytest.fixture
def gguf(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "user-model.gguf"
    write_tiny_gguf(path)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recorded(folder: Path) -> dict:
    return json.loads((folder / cache_records.FILES_RECORD).read_text())["files"]


def test_a_conversion_records_every_files_size_and_checksum(gguf):
    folder = checkpoints.gguf_dir(gguf)
    files = recorded(folder)
    on_disk = {p.name for p in folder.iterdir() if p.name != cache_records.FILES_RECORD}
    assert set(files) == on_disk and "model.safetensors" in on_disk
    for name, made in files.items():
        assert made["size"] == (folder / name).stat().st_size and made["sha256"] == sha256(folder / name)


def cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum tells
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, words", [(cut, "bytes,"), (flip, "SHA-256 differs")], ids=["truncated", "flipped-bytes"]
)
def test_a_changed_cache_is_said_in_one_line_and_converted_again(gguf, caplog, damage, words):
    """The issue's truncated cache gave a SafetensorError traceback and was never repaired; flipped bytes gave an
    OverflowError in the perplexity and head contributions of ±100 with no warning."""
    folder = checkpoints.gguf_dir(gguf)
    weights = folder / "model.safetensors"
    good = sha256(weights)
    damage(weights)
    with caplog.at_level(logging.WARNING, logger=checkpoints.__name__):
        bundle = cwviz.load_model(str(gguf), device="cpu")
    said = [r.getMessage() for r in caplog.records if "not as it was converted" in r.getMessage()]
    assert len(said) == 1 and words in said[0] and "converting it again" in said[0] and "\n" not in said[0], said
    assert sha256(weights) == good and cache_records.changed(folder) is None
    assert cwviz.analyze(bundle, "the cat sat").perplexity < 1e6
    assert not [p for p in folder.parent.iterdir() if p.name.startswith((".stale-", ".write-"))]


def test_an_untouched_cache_reads_no_weights_to_prove_itself(gguf, monkeypatch):
    folder = checkpoints.gguf_dir(gguf)
    monkeypatch.setattr(
        cache_records, "_sha256", lambda path: pytest.fail(f"{path} was hashed on a load of an untouched cache")
    )
    assert cache_records.changed(folder) is None


def test_a_cache_converted_before_the_record_is_checked_by_its_headers_and_recorded(gguf):
    folder = checkpoints.gguf_dir(gguf)
    (folder / cache_records.FILES_RECORD).unlink()
    assert cache_records.changed(folder) is None and (folder / cache_records.FILES_RECORD).is_file()
    (folder / cache_records.FILES_RECORD).unlink()
    cut(folder / "model.safetensors")
    assert "model.safetensors" in cache_records.changed(folder)


def one_error(code: int, err: str) -> str:
    """The one ``error:`` line of a run that exits 2 without a traceback (transformers' progress bar may precede it)."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _cache_left(gguf: Path) -> list[str]:
    models = Path(checkpoints.cache_dir()) / "models"
    return [p.name for p in models.iterdir() if not p.name.startswith(".lock-")] if models.is_dir() else []


def test_a_disk_without_room_is_one_line_naming_cwviz_cache_and_the_space_needed(gguf, monkeypatch, capsys):
    """The issue's full disk under CWVIZ_CACHE gave a 15-frame SafetensorError traceback."""
    monkeypatch.setattr(cache_records, "free_bytes", lambda folder: 1000)
    with pytest.raises(
        ModelLoadError,
        match=r"needs about [\d,]+ MB in .*\(CWVIZ_CACHE=.*\), and its disk has 0 MB "
        r"free",
    ):
        checkpoints.gguf_dir(gguf)
    assert _cache_left(gguf) == []
    code, _, err = call(["analyze", "--model", gguf, "--device", "cpu", "--text", "hello"], capsys)
    assert one_error(code, err).endswith("free some space, or point CWVIZ_CACHE at a disk with room"), err


def test_a_write_that_fails_half_way_leaves_no_partial_file(gguf, monkeypatch, capsys):
    """The disk fills while the weights are written (the safetensors writer's own error): one line, no folder left."""

    def full_disk(self, folder, *args, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")

    from transformers import PreTrainedModel

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    code, _, err = call(["analyze", "--model", gguf, "--device", "cpu", "--text", "hello"], capsys)
    line = one_error(code, err)
    assert line.startswith("error: could not write the converted model into") and "CWVIZ_CACHE" in line, err
    assert _cache_left(gguf) == []
