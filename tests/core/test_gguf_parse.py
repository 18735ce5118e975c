"""What a GGUF's conversion relies on in gguf and transformers (:mod:`cwviz.core.loading.checkpoints`), pinned so that
an upgrade that changes it fails here, saying what to change, instead of silently slowing or breaking the conversion.

* :func:`~cwviz.core.loading.checkpoints.parsed_once` swaps the ``gguf.GGUFReader`` module attribute during a
  conversion, the one swap of another package's attribute cwviz makes: it is worth making only while transformers parses
  a llama or gemma3 GGUF's header through that attribute, looked up at each call, several times a conversion (config,
  weights, tokenizer's class);
* :func:`~cwviz.core.loading.checkpoints.plain_reader` relies on gguf's reader keeping its ``numpy.memmap`` in ``data``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cwviz.core.loading import checkpoints
from tests.helpers import write_tiny_gguf


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def _parses(monkeypatch) -> list[tuple[str, str, type]]:
    """Every parse of a GGUF from now on, by any reader class: (file name, class name, type of its ``data``)."""
    import gguf.gguf_reader as reader_module

    parses = []
    init = reader_module.GGUFReader.__init__

    def counted(self, path, *args, **kwargs):
        init(self, path, *args, **kwargs)
        parses.append((Path(path).name, type(self).__name__, type(self.data)))

    monkeypatch.setattr(reader_module.GGUFReader, "__init__", counted)
    return parses


def test_transformers_parses_a_gguf_header_three_times_through_the_gguf_module(tiny_gguf, monkeypatch):
    """What parsed_once relies on: transformers' own reading of a llama GGUF (config, weights, tokenizer) asks the
    ``gguf`` module for ``GGUFReader`` at each call, three times. Fewer (transformers reads the header once, or with its
    own reader): delete parsed_once and its swap. None seen (the class bound at import): the swap no longer works."""
    import gguf

    looked_up = []
    real = gguf.GGUFReader

    def reader(path, *args, **kwargs):
        looked_up.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", reader)
    parses = _parses(monkeypatch)
    checkpoints.read_gguf(tiny_gguf)
    assert looked_up == [tiny_gguf.name] * 3, (
        f"transformers looked up gguf.GGUFReader {len(looked_up)} times for one GGUF (3 expected): "
        "checkpoints.parsed_once's swap of that attribute is useless or broken; remove it or adapt it to transformers"
    )
    assert [name for name, *_ in parses] == [tiny_gguf.name] * 3


def test_a_conversion_parses_the_header_once_through_a_plain_array(tiny_gguf, monkeypatch):
    """Under parsed_once the three readers are one, parsed once by cwviz's own reader class through a plain ndarray
    (not numpy.memmap, whose Python-level slicing made the parse slow); the gguf module is as it was afterwards."""
    import gguf

    parses = _parses(monkeypatch)
    with checkpoints.parsed_once(tiny_gguf):
        model, _ = checkpoints.read_gguf(tiny_gguf)
    assert parses == [(tiny_gguf.name, "PlainReader", np.ndarray)]
    assert gguf.GGUFReader is gguf.gguf_reader.GGUFReader and gguf.gguf_reader.np is np
    assert model.config.num_hidden_layers == 2


def test_the_plain_reader_parses_as_gguf_does(tiny_gguf):
    """plain_reader's parse equals gguf's own, field for field and tensor for tensor, and it holds the file as a plain
    ndarray: gguf's reader still keeps its mapping in ``data``, where the subclass takes it."""
    from gguf import GGUFReader

    plain, own = checkpoints.plain_reader(tiny_gguf), GGUFReader(tiny_gguf)
    assert type(plain.data) is np.ndarray and isinstance(own.data, np.memmap)
    assert list(plain.fields) == list(own.fields)
    for name, field in plain.fields.items():
        other = own.fields[name]
        assert (field.types, field.data) == (other.types, other.data), name
        assert all(np.array_equal(a, b) for a, b in zip(field.parts, other.parts, strict=True)), name
    assert [(t.name, t.tensor_type, t.data_offset) for t in plain.tensors] == [
        (t.name, t.tensor_type, t.data_offset) for t in own.tensors
    ]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(plain.tensors, own.tensors, strict=True))
