"""The one runner of cwviz's jobs over many items: a command's or a page's items, in memory or into a results folder.

Every job over a run's items goes through :func:`run`: ``cwviz faithfulness``, ``cwviz sinks``, ``cwviz atlas`` and
``cwviz claims`` (with ``--results DIR`` or without), the Faithfulness, Claims and Atlas pages and the Sinks page's
pooled prompts. A caller says what one item computes (``compute(index)``: the record type's payload) and shows the
records it gets back; the runner owns the order, resume, the folder's files and lock, sharding, progress and cancel:

* each finished item becomes one record (:func:`cwviz.analyses.records.make_record`) that carries the run's
  **fingerprint**, the sha256 of the settings that decide its numbers (the record type's ``settings`` and the model's
  provenance, not the batch size or the device), and its text's hash; without a folder (``Sweep.folder`` None: a
  page, or a command without ``--results``) it goes into the caller's ``store`` (example -> record), with one into
  this process's ``records-<process>.jsonl`` too, flushed and fsynced before the next item starts, so a killed run
  loses at most the item in progress;
* the records already made (the folder's, or the ``store``'s) are checked against the run's fingerprint and texts and
  not made again: ``--resume``, or a page's rerun with the same settings, continues a run; other settings or other
  data are refused;
* ``progress(done, total)`` after each item; ``cancel()`` is asked before each item and Ctrl-C (or SIGTERM, which
  :mod:`cwviz.cli.main` turns into KeyboardInterrupt) is caught: either ends the run with the finished items kept
  and returned (:attr:`Outcome.interrupted`). Anything else raised (an error, a page's Stop) leaves the finished
  items in the folder or the store;
* under ``torchrun`` or ``accelerate launch`` (:func:`cwviz.core.util.parallel.processes`) each process runs its share
  of the unfinished items (:func:`cwviz.core.util.parallel.shard`) into its own file; the main process then reads every
  record back (:func:`cwviz.analyses.records.read_records`, the one place records are read and checked), and the
  command recomputes its summary from them, so one process and N give the same records and the same summary;
* the main process writes ``manifest.json`` (how the run was made);
* a folder has one run at a time: the command holds :func:`owned` around its run and the files it writes after,
  and a second run on the folder is refused as busy (:func:`cwviz.analyses.records.folder_lock`: an ``flock`` the
  OS drops when the process dies, so a killed run leaves nothing stuck). Under a launcher the main process takes it
  before the first barrier; should it be refused, it exits and the launcher ends the others.

What a record of each type holds and how it goes back to tables is its codec (:mod:`cwviz.analyses.codecs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from ..core.util.errors import InputError
from ..core.util.parallel import Processes, shard
from ..core.util.progress import Progress
from . import records
from .codecs.base import Codec
from .resume import check_resumable, setting_changes

#: What a run asks before each item: True ends it there, the finished items kept.
Cancel = Callable[[], bool]


@dataclass(frozen=True)
class Sweep:
    """A run of ``record_type`` over ``texts`` (what item i's record hashes): ``settings`` decide the records' numbers
    (their fingerprint); into ``folder`` with ``manifest`` written as ``manifest.json``, or in memory (None)."""

    record_type: Codec
    settings: dict
    texts: Sequence[str]
    folder: Path | None = None
    manifest: dict | None = None

    @property
    def key(self) -> str:
        return records.fingerprint(self.settings)


@dataclass(frozen=True)
class Outcome:
    """What :func:`run` leaves: every record of the run, by example (a folder's read back by the main process, []
    in the others), and whether this process stopped (cancel, Ctrl-C or SIGTERM) before its share was done."""

    records: list[dict]
    interrupted: bool
    is_main: bool


def check_folder(folder: Path, flag: str = "--results") -> None:
    """Before any model loads: InputError unless ``folder`` can be a results folder (its parent exists, it is no
    file)."""
    if not folder.parent.is_dir():
        raise InputError(f"no folder {folder.parent} for {flag}; create it first")
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{flag} {folder} is a file; give a folder")


@contextmanager
def owned(folder: Path, procs: Processes) -> Iterator[None]:
    """The main process creates ``folder`` and holds it (:func:`cwviz.analyses.records.folder_lock`) for the block:
    wrap :func:`run` and every file the command writes from its outcome. The other processes follow the main one."""
    if not procs.is_main:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)  # its parent was checked before the model loaded (check_folder)
    with records.folder_lock(folder):
        yield


def run(
    sweep: Sweep,
    compute: Callable[[int], dict],
    procs: Processes = Processes(),
    resume: bool = False,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
    store: MutableMapping[int, dict] | None = None,
) -> Outcome:
    """Run the items of ``sweep`` not yet recorded (module docstring): this process's share, each record kept as it
    is made; ``progress(done, total)`` after each of this process's items; ``cancel()`` before each.

    In memory, ``store`` (example -> record; the caller keeps it between runs) holds the records already made and
    takes each new one. Into a folder, every process must call it (it waits for the others twice), inside
    :func:`owned`; a folder that already holds records is refused without ``resume``, and with it unless the records
    share the run's fingerprint and texts."""
    folder, key = sweep.folder, sweep.key
    hashes = [records.text_hash(t) for t in sweep.texts]
    if folder is None:
        store = {} if store is None else store
        done = check_resumable(store.values(), key, hashes, "the records kept in memory")
    else:
        procs.barrier()
        existing = records.read_records(folder, sweep.record_type)
        if existing and not resume:
            raise InputError(
                f"{folder} already holds {len(existing)} record(s); add --resume to continue that run, or "
                "give a fresh folder"
            )
        made = records.read_manifest(folder, sweep.record_type) or {}
        changes = setting_changes(made["settings"], sweep.settings) if "settings" in made else ()
        done = check_resumable(existing, key, hashes, folder, changes)
        procs.barrier()  # every process has read the records before any appends
    mine = shard([i for i in range(len(sweep.texts)) if i not in done], procs.index, procs.count)
    if folder is not None and procs.is_main:
        records.write_manifest(folder, sweep.manifest)
    interrupted = False
    try:
        with (
            records.RecordWriter(records.records_path(folder, procs.index))
            if folder is not None
            else nullcontext() as writer
        ):
            for count, index in enumerate(mine, start=1):
                if cancel is not None and cancel():
                    interrupted = True
                    break
                record = records.make_record(sweep.record_type, index, sweep.texts[index], key, compute(index))
                if writer is not None:
                    writer.write(record)
                if store is not None:
                    store[index] = record
                if progress is not None:
                    progress(count, len(mine))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (cwviz.cli.main): the records made so far are kept
        interrupted = True
    if folder is None:
        return Outcome([store[i] for i in sorted(store)], interrupted, True)
    if not interrupted:
        procs.barrier()
    if not procs.is_main:
        return Outcome([], interrupted, False)
    return Outcome(records.read_records(folder, sweep.record_type), interrupted, True)
