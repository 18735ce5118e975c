"""The one sweep runner of cwviz: a dataset command's items run into a results folder, resumable and sharded.

``cwviz faithfulness``, ``cwviz sinks`` and ``cwviz atlas`` (``--results DIR``), and the dashboard's Faithfulness
page, run their items through :func:`run` (a folder) or :func:`item_records` (in memory, the page):

* each finished item becomes one record (:func:`cwviz.analyses.records.make_record`), appended to this process's
  ``records-<process>.jsonl``, flushed and fsynced before the next item starts, so a killed run loses at most the
  item in progress;
* the records carry the run's **fingerprint**, the sha256 of the settings that decide their numbers (the kind's
  settings and the model's provenance, not the batch size or the device), and each item's text hash, so
  ``--resume`` runs only the items not yet recorded, and refuses a folder made by other settings or other data;
* under ``torchrun`` or ``accelerate launch`` (:func:`cwviz.core.util.parallel.processes`) each process runs its share
  of the unfinished items (:func:`cwviz.core.util.parallel.shard`) into its own file; the main process then reads every
  record back (:func:`cwviz.analyses.records.read_records`, the one place records are read and checked), and the
  command recomputes its summary from them, so one process and N give the same records and the same summary;
* the main process writes ``manifest.json`` (how the run was made);
* a folder has one run at a time: the command holds :func:`owned` around its run and the files it writes after,
  and a second run on the folder is refused as busy (:func:`cwviz.analyses.records.folder_lock`: an ``flock`` the
  OS drops when the process dies, so a killed run leaves nothing stuck). Under a launcher the main process takes it
  before the first barrier; should it be refused, it exits and the launcher ends the others.

Below the runner, each kind's record payload and the way back from records to the kind's tables: faithfulness
(:func:`faithfulness_item`, :func:`faithfulness_summary`), sinks (:func:`sinks_payload`, :func:`sinks_tables`)
and the atlas (:func:`atlas_payload`, :func:`atlas_per_prompt`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.util.errors import InputError
from ..core.util.parallel import Processes, model_provenance, shard
from ..core.util.progress import Progress
from . import faithfulness, tasks
from . import records as R
from .schema import ATLAS_METRICS
from .sinks import TABLE_COLUMNS

#: The kinds of record (``cwviz.<kind>.record``), one per sweeping command.
FAITHFULNESS, SINKS, ATLAS = R.FAITHFULNESS, R.SINKS, R.ATLAS


# -- the runner ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sweep:
    """A sweep of ``kind`` over ``texts`` (what item i's record hashes) into ``folder``; ``settings`` decide the
    records' numbers (their fingerprint); ``manifest`` is written as ``manifest.json``."""

    kind: str
    folder: Path
    settings: dict
    texts: Sequence[str]
    manifest: dict

    @property
    def key(self) -> str:
        return R.fingerprint(self.settings)


@dataclass(frozen=True)
class Outcome:
    """What :func:`run` leaves: every record in the folder (read back by the main process; [] elsewhere) and
    whether this process was interrupted (Ctrl-C or SIGTERM) before its share was done."""

    records: list[dict]
    interrupted: bool
    is_main: bool


def check_folder(folder: Path, flag: str = "--results") -> None:
    """Before any model loads: InputError unless ``folder`` can be a results folder (its parent exists, it is no file)."""
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
    with R.folder_lock(folder):
        yield


def model_settings(provenance: dict) -> dict:
    """What of the model's provenance (:func:`cwviz.core.util.parallel.model_provenance`) decides the numbers (not the device)."""
    return {k: provenance[k] for k in ("id", "architecture", "revision", "weights_sha256", "dtype")}


def item_records(kind: str, key: str, texts: Sequence[str], compute: Callable[[int], dict], indices: Iterable[int]) -> Iterator[dict]:
    """The record of each item in ``indices``, made as it is computed (``compute(index)``: the kind's payload)."""
    for index in indices:
        yield R.make_record(kind, index, texts[index], key, compute(index))


def run(sweep: Sweep, compute: Callable[[int], dict], procs: Processes, resume: bool = False, progress: Progress | None = None) -> Outcome:
    """Run the items of ``sweep`` not yet recorded (module docstring): this process's share, each record appended
    and fsynced as it is made; ``progress(done, total)`` after each of this process's items. A folder that already
    holds records is refused without ``resume``, and with it unless the records share the run's fingerprint and
    texts. Every process must call it (it waits for the others twice), inside :func:`owned`."""
    folder, key = sweep.folder, sweep.key
    procs.barrier()
    existing = R.read_records(folder, sweep.kind)
    if existing and not resume:
        raise InputError(f"{folder} already holds {len(existing)} record(s); add --resume to continue that run, or give a fresh folder")
    done = R.check_resumable(existing, key, [R.text_hash(t) for t in sweep.texts], folder)
    procs.barrier()  # every process has read the records before any appends
    mine = shard([i for i in range(len(sweep.texts)) if i not in done], procs.index, procs.count)
    if procs.is_main:
        R.write_manifest(folder, sweep.manifest)
    interrupted = False
    try:
        with R.RecordWriter(R.records_path(folder, procs.index)) as writer:
            for count, record in enumerate(item_records(sweep.kind, key, sweep.texts, compute, mine), start=1):
                writer.write(record)
                if progress is not None:
                    progress(count, len(mine))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (cwviz.cli.main): the records written so far are kept
        interrupted = True
    if not interrupted:
        procs.barrier()
    if not procs.is_main:
        return Outcome([], interrupted, False)
    return Outcome(R.read_records(folder, sweep.kind), interrupted, True)


# -- faithfulness ------------------------------------------------------------------------------------
def item_text(example) -> str:
    """What a faithfulness record hashes: the text, or a multiple-choice item (:class:`cwviz.analyses.tasks.Item`) as one string."""
    return example if isinstance(example, str) else example.text


def faithfulness_settings(protocol, provenance: dict, task: str = "text") -> dict:
    """What decides a faithfulness record's numbers: the protocol (not its batch size), the model, the task. The query
    rank scope (the only one before scopes existed) is left out, so folders made before then still resume; any
    other scope is in, so a resume with another scope is refused."""
    settings = {k: v for k, v in asdict(protocol).items() if k != "batch_size"}
    if settings.get("rank_scope") == "query":
        del settings["rank_scope"]
    return {"protocol": settings, "model": model_settings(provenance), "task": task}


def faithfulness_item(bundle, examples: Sequence, protocol, task: str = "text", **options) -> Callable[[int], dict]:
    """``compute(index)`` for :func:`run`: example ``index`` of ``examples`` (texts, or a task's items) through the
    one example loop (:func:`cwviz.analyses.faithfulness.iter_examples`, :func:`cwviz.analyses.tasks.iter_items`;
    ``options``: their ``guard`` and ``progress``), as a record's payload (:func:`cwviz.analyses.records.example_payload`)."""
    loop = faithfulness.iter_examples if task == "text" else tasks.iter_items

    def compute(index: int) -> dict:
        ((_, table),) = loop(bundle, [examples[index]], protocol, start=index, **options)
        return R.example_payload(task, table) | {"rank_scope": protocol.rank_scope}

    return compute


def faithfulness_records(bundle, examples: Sequence, protocol, task: str = "text", start: int = 0, **options) -> Iterator[dict]:
    """In memory (the dashboard's run, which has no folder): the records of ``examples[start:]``, one at a time, made
    exactly as :func:`run` makes them for the CLI (the same fingerprint, envelope and payload)."""
    key = R.fingerprint(faithfulness_settings(protocol, model_provenance(bundle), task))
    compute = faithfulness_item(bundle, examples, protocol, task, **options)
    return item_records(FAITHFULNESS, key, [item_text(e) for e in examples], compute, range(start, len(examples)))


def faithfulness_summary(records: Sequence[dict], seed: int = 0) -> pd.DataFrame:
    """The summary (:func:`cwviz.analyses.faithfulness.summarize`) of the records' finished examples (none: empty)."""
    table = R.records_table(records)
    return faithfulness.summarize(table, seed=seed) if len(table) else pd.DataFrame(columns=faithfulness.SUMMARY_COLUMNS)


# -- sinks -------------------------------------------------------------------------------------------


def sinks_settings(sink: str, factor: float, ppl: bool, provenance: dict) -> dict:
    """What decides a sinks record's numbers: the sink asked for, λ and whether ΔPPL runs, and the model."""
    return {"sink": str(sink).strip().lower(), "factor": float(factor), "ppl": bool(ppl), "model": model_settings(provenance)}


def _floats(values: pd.Series) -> list[float]:
    # float32's shortest decimal text reads back to the same float32: the table is restored bit for bit
    return [float(text) for text in values.to_numpy(np.float32).astype(str)]


def sinks_payload(table: pd.DataFrame, sink: int, tokens: Sequence[str], ppl: np.ndarray | None, clean: float | None) -> dict:
    """One prompt's sinks record payload: its whole :func:`~cwviz.analyses.sinks.sink_table` (one row per layer,
    head and query that sees the sink; about 12 numbers a row), its tokens, and with ΔPPL the perplexities with the
    sink's value scaled in each layer, then in all (``ppl``, [layers + 1]), and the clean one."""
    columns = {name: table[name].astype(np.int64).tolist() for name in R.SINK_INTS}
    columns |= {name: _floats(table[name]) for name in R.SINK_FLOATS}
    return {
        "sink": int(sink),
        "tokens": list(tokens),
        "ppl": None if ppl is None else [float(p) for p in ppl],
        "ppl_clean": None if clean is None else float(clean),
        "table": columns,
    }


def sinks_table(record: dict) -> pd.DataFrame:
    """The :func:`~cwviz.analyses.sinks.sink_table` a sinks record holds, columns and dtypes as made."""
    columns = record["table"]
    frame = pd.DataFrame({name: np.asarray(columns[name], dtype=np.int64) for name in R.SINK_INTS})
    for name in R.SINK_FLOATS:
        frame[name] = np.asarray(columns[name], dtype=np.float32)
    frame["sink_attention_share"] = frame["sink_ratio"]
    frame["sink"] = np.int64(record["sink"])
    frame["token"] = np.asarray(record["tokens"], dtype=object)[frame["query"].to_numpy()]
    return frame[list(TABLE_COLUMNS)]


def sinks_tables(records: Sequence[dict]) -> list[pd.DataFrame]:
    """Each record's table, in the records' (example) order."""
    return [sinks_table(record) for record in records]


# -- atlas -------------------------------------------------------------------------------------------
def atlas_payload(frame: pd.DataFrame) -> dict:
    """One prompt's atlas record payload: its :func:`~cwviz.analyses.atlas.prompt_stats` (one row per layer and head)."""
    return {
        "tokens": int(frame["tokens"].iloc[0]),
        "layer": frame["layer"].astype(np.int64).tolist(),
        "head": frame["head"].astype(np.int64).tolist(),
        **{name: [float(v) for v in frame[name]] for name in ATLAS_METRICS},
    }


def atlas_per_prompt(records: Sequence[dict]) -> pd.DataFrame:
    """The per-prompt table (:func:`~cwviz.analyses.atlas.iter_prompt_stats`, concatenated) of the records, each
    prompt numbered by its place among them (its example index when every prompt is recorded)."""
    if not records:
        raise InputError("no prompt was analysed; nothing to pool")
    frames = [
        pd.DataFrame(
            {
                "prompt": number,
                "tokens": record["tokens"],
                "layer": np.asarray(record["layer"], dtype=np.int64),
                "head": np.asarray(record["head"], dtype=np.int64),
                **{name: np.asarray(record[name], dtype=np.float64) for name in ATLAS_METRICS},
            }
        )
        for number, record in enumerate(records)
    ]
    return pd.concat(frames, ignore_index=True)
