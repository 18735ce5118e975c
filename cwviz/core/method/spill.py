"""Layer records of a long prompt kept in a file on disk instead of in memory.

At 8,192 tokens the embedded model's records (queries, keys, values and head outputs of 30 layers, 6 KB a
token a layer in float32) take 1.5 GB, 4.5 times the peak of the forward pass itself, while a page reads one
layer at a time. So when a pass's records would exceed ``CWVIZ_SPILL_MB`` (default :data:`SPILL_MB`, MiB), an
analysis on the CPU writes each layer's tensors to an unlinked temporary file as the layer runs and reads a
layer back when it is asked for, keeping the last :data:`LOADED` layers read. What is written is the tensors'
bytes, so a layer read back is bit for bit the layer recorded: every measure is the same as in memory.

Choices:

* The file is in ``CWVIZ_SPILL_DIR`` (default ``spill/`` in cwviz's cache folder,
  :func:`cwviz.core.util.settings.cache_dir`), not in ``/tmp``, which is often a RAM disk. It is unlinked at creation:
  nothing is left behind when the analysis is dropped or the process dies.
* Reads and writes are ``pread``/``pwrite`` into buffers of the process, not a memory map, so the operating
  system's file cache holds the layers (and may drop them under pressure, to read them from disk again) and the
  process keeps only the layers it reads. A layer read back at 8,192 tokens is 50 MB and takes tens of
  milliseconds from the file cache.
* Records are spilled only on the CPU and only when the folder has room for them (:func:`spill_for`); otherwise
  they stay in memory, where the memory check of :mod:`cwviz.core.method.memory` applies.
* During the pass a layer keeps only where its bytes lie and its record's other fields; the shell's tensors
  (on the ``meta`` device) are made when the shell is first asked for. Small objects made during the pass and
  kept would lie between the pass's freed activations, and glibc could not reuse those as one block: the heap
  could then grow by about a layer's records a layer.
* Reading a layer back first returns the heap's free pages to the system (:func:`cwviz.core.util.heap.trim_heap`), in a
  process whose entry point opted in (the dashboard's server, the ``cwviz`` command): what the row blocks of the layer
  before left there. Reading a long prompt through, layer after layer (the head overview), then holds one layer's worth
  of heap, not a growing one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..util.heap import trim_heap
from ..util.settings import cache_dir, env_int

#: Records of a pass (MiB) above which they go to disk (``CWVIZ_SPILL_MB`` overrides).
SPILL_MB = 512
#: Layers read back and kept in memory at once (50 MB each at 8,192 tokens on the embedded model): the layer a
#: page shows and the one before it, so going back and forth between two layers reads nothing.
LOADED = 2
_FIELDS = ("query", "key", "value", "output")


def spill_dir() -> Path:
    """Where spill files go: ``$CWVIZ_SPILL_DIR``, else ``spill/`` in cwviz's cache folder."""
    env = os.environ.get("CWVIZ_SPILL_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    return cache_dir() / "spill"


def spill_bytes() -> int:
    """Bytes of records above which a pass spills them (``CWVIZ_SPILL_MB``, MiB)."""
    return env_int("CWVIZ_SPILL_MB", SPILL_MB) << 20


def spill_for(recorded: int, device: torch.device) -> SpilledRecords | None:
    """A :class:`SpilledRecords` for a pass whose records take ``recorded`` bytes, or None to keep them in memory:
    on the CPU, above :func:`spill_bytes`, when the spill folder can be made and has room for them and a tenth more."""
    if device.type != "cpu" or recorded <= spill_bytes():
        return None
    folder = spill_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(folder).free < 1.1 * recorded:
            return None
        return SpilledRecords(folder)
    except OSError:
        return None


@dataclass(frozen=True)
class _Place:
    """Where one layer's tensors lie in the file: (offset, shape, dtype) per field of :data:`_FIELDS`."""

    parts: tuple[tuple[int, torch.Size, torch.dtype], ...]

    @property
    def start(self) -> int:
        return self.parts[0][0]

    @property
    def nbytes(self) -> int:
        offset, shape, dtype = self.parts[-1]
        return offset + shape.numel() * dtype.itemsize - self.start


class SpilledRecords(Sequence):
    """The :class:`~cwviz.core.method.capture.LayerRecord` of each layer, its tensors in an unlinked file.

    Filled by a recording pass (``records[layer] = record``, layers in any order, each once); then
    ``records[layer]`` reads the layer back (bit for bit what was written), keeping the last :data:`LOADED`
    layers read. ``shell(layer)`` is the record without reading it: the same mask, scaling, soft-capping and
    learned sinks, its four tensors on the ``meta`` device (shapes and dtypes only). Safe to share between
    threads.
    """

    def __init__(self, folder: Path) -> None:
        self._file = tempfile.TemporaryFile(dir=folder, prefix="cwviz-records-")
        self._end = 0
        self._places: dict[int, _Place] = {}
        self._shells: dict[int, object] = {}
        self._loaded: OrderedDict[int, object] = OrderedDict()
        self._lock = threading.Lock()

    def __setitem__(self, layer: int, record) -> None:
        parts, offset = [], self._end
        for name in _FIELDS:
            tensor = getattr(record, name).detach().contiguous()
            _write(self._file.fileno(), tensor.view(-1).view(torch.uint8), offset)
            parts.append((offset, tensor.shape, tensor.dtype))
            offset += tensor.numel() * tensor.element_size()
        self._end = offset
        self._places[layer] = _Place(tuple(parts))
        # The record without its tensors: the shell's meta tensors are made in shell(), after the pass (module
        # docstring).
        self._shells[layer] = replace(record, **dict.fromkeys(_FIELDS))

    def __len__(self) -> int:
        return len(self._places)

    def __getitem__(self, layer):
        if isinstance(layer, slice):
            return [self[k] for k in range(len(self))[layer]]
        layer = range(len(self))[layer]  # negative indices; IndexError past the end
        with self._lock:
            record = self._loaded.get(layer)
            if record is not None:
                self._loaded.move_to_end(layer)
                return record
            place = self._places[layer]
            while len(self._loaded) >= LOADED:  # before the new buffer is made: at most LOADED layers at once
                self._loaded.popitem(last=False)
            trim_heap()  # what the layer before left in the heap goes back to the system
            buffer = torch.empty(place.nbytes, dtype=torch.uint8)
            _read(self._file.fileno(), buffer, place.start)
            tensors = {}
            for name, (offset, shape, dtype) in zip(_FIELDS, place.parts):
                begin = offset - place.start
                tensors[name] = buffer[begin : begin + shape.numel() * dtype.itemsize].view(dtype).view(shape)
            record = replace(self._shells[layer], **tensors)
            self._loaded[layer] = record
            return record

    def __iter__(self) -> Iterator:
        return (self[k] for k in range(len(self)))

    def field(self, layer: int, name: str) -> torch.Tensor:
        """One tensor (``name``, of :data:`_FIELDS`) of layer ``layer``'s record, bit for bit as written: the loaded
        record's when the layer is loaded, else only that tensor's bytes are read (and not kept), so a reader of one
        field (the recorded head outputs, a quarter of a layer) reads no more of the file than it needs."""
        layer = range(len(self))[layer]
        with self._lock:
            record = self._loaded.get(layer)
            if record is not None:
                return getattr(record, name)
            offset, shape, dtype = self._places[layer].parts[_FIELDS.index(name)]
        buffer = torch.empty(shape.numel() * dtype.itemsize, dtype=torch.uint8)
        _read(self._file.fileno(), buffer, offset)
        return buffer.view(dtype).view(shape)

    def shell(self, layer: int):
        """Layer ``layer``'s record without its tensors (they are on the ``meta`` device): nothing is read."""
        layer = range(len(self))[layer]
        with self._lock:
            shell = self._shells[layer]
            if shell.query is None:
                parts = self._places[layer].parts
                shell = replace(
                    shell, **{n: torch.empty(s, dtype=d, device="meta") for n, (_, s, d) in zip(_FIELDS, parts)}
                )
                self._shells[layer] = shell
            return shell

    @property
    def nbytes(self) -> int:
        """Bytes written to the file."""
        return self._end


def _write(fd: int, data: torch.Tensor, offset: int) -> None:
    view = memoryview(data.numpy())
    while view.nbytes:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _read(fd: int, buffer: torch.Tensor, offset: int) -> None:
    view = memoryview(buffer.numpy())
    while view.nbytes:
        done = os.preadv(fd, [view], offset)
        if done == 0:
            raise OSError(f"the spill file ended early at byte {offset}")
        view, offset = view[done:], offset + done


def by_layer(records: dict | SpilledRecords, layers: int) -> Sequence:
    """A recording pass's records (:func:`cwviz.core.method.capture.forward_pass`: ``LayerRecord`` by layer, a dict or
    on disk) as a sequence by layer: on disk as they are, else a tuple."""
    return records if isinstance(records, SpilledRecords) else tuple(records[layer] for layer in range(layers))


def record_field(records: Sequence, layer: int, name: str) -> torch.Tensor:
    """One tensor of layer ``layer``'s record in :func:`by_layer`'s sequence: of a layer on disk, only its bytes are
    read (:meth:`SpilledRecords.field`)."""
    return records.field(layer, name) if isinstance(records, SpilledRecords) else getattr(records[layer], name)
