"""The codecs of the sweeps' records: ``cwviz faithfulness`` (and the multiple-choice tasks), ``cwviz sinks`` and
``cwviz atlas``, with the pages that read their folders. What a codec is: :mod:`cwviz.analyses.codecs`.

A faithfulness record's payload (:meth:`FaithfulnessCodec.encode`; a multiple-choice task's item is a faithfulness
record whose ``task`` names it and whose ``correct_*`` fields are set) is

    {"task": "text" | "mmlu" | ..., "skipped": bool, "tokens": int, "ppl_clean": float, "correct_clean": 0 | 1 | null,
     "runs": [{"measure", "curve", "rate", "ppl_masked", "delta_ppl", "correct_masked"}, ...],
     "rank_scope": "query" | "token" | "layer"}  (absent in records made before scopes: query)

a sinks record's a prompt's whole sink table (:meth:`SinksCodec.encode`), and an atlas record's a prompt's per-head
statistics (:meth:`AtlasCodec.encode`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.util.errors import InputError
from .. import faithfulness, faithfulness_summary
from ..records import (
    FLAG,
    INT,
    MANIFEST,
    NUMBER,
    TEXT,
    Field,
    check_fields,
    is_int,
    is_number,
    list_of,
    optional,
    shown,
)
from ..schema import ATLAS_METRICS, RANK_SCOPES
from ..sinks import TABLE_COLUMNS
from .base import COUNT, NAMES, NUMBERS, Codec, agrees, data_count, in_range, model_settings, same_length

# -- faithfulness (and multiple-choice tasks) ------------------------------------------------------------
#: The keys and types of one masked run of a faithfulness record.
RUN: dict[str, Field] = {
    "measure": TEXT,
    "curve": TEXT,
    "rate": NUMBER,
    "ppl_masked": NUMBER,
    "delta_ppl": NUMBER,
    "correct_masked": (optional(is_int), "an integer or null"),
    "draw": (lambda v: is_int(v) and v >= 0, "a draw number (0 or more)"),
}


class FaithfulnessCodec(Codec):
    """``cwviz faithfulness`` (text, or a multiple-choice task's items) and the Faithfulness page."""

    name = "faithfulness"
    payload = {
        "task": TEXT,
        "skipped": FLAG,
        "tokens": INT,
        "ppl_clean": (optional(is_number), "a number or null"),
        "correct_clean": (optional(is_int), "an integer or null"),
        "runs": (list_of(lambda v: isinstance(v, dict)), "a list of runs"),
    }
    manifest_fields = {
        "fingerprint": TEXT,
        "seed": INT,
        "rates": NUMBERS,
        "measures": NAMES,
        "data": data_count("examples"),
    }

    def settings(self, protocol, provenance: dict, task: str = "text") -> dict:
        """What decides a record's numbers: the protocol (not its batch size), the model, the task. The query rank
        scope (the only one before scopes existed) is left out, so folders made before then still resume; any other
        scope is in, so a resume with another scope is refused."""
        kept = {k: v for k, v in asdict(protocol).items() if k != "batch_size"}
        if kept.get("rank_scope") == "query":
            del kept["rank_scope"]
        return {"protocol": kept, "model": model_settings(provenance), "task": task}

    def encode(self, task: str, table: pd.DataFrame | None, rank_scope: str | None = None) -> dict:
        """One example's payload from its per-example table (:func:`cwviz.analyses.faithfulness.run_example` or
        :func:`cwviz.analyses.tasks.run_item`; None: skipped, too short), with ``rank_scope`` when given."""
        scope = {} if rank_scope is None else {"rank_scope": rank_scope}
        record: dict = {"task": task, "skipped": table is None}
        if table is None:
            return {**record, "tokens": 0, "ppl_clean": None, "correct_clean": None, "runs": [], **scope}
        first = table.iloc[0]
        correct = "correct_masked" in table
        runs = [
            {
                "measure": row.measure,
                "curve": row.curve,
                "rate": float(row.rate),
                "ppl_masked": float(row.ppl_masked),
                "delta_ppl": float(row.delta_ppl),
                "correct_masked": int(row.correct_masked) if correct else None,
                "draw": int(getattr(row, "draw", 0)),
            }
            for row in table.itertuples(index=False)
        ]
        clean = int(first.correct_clean) if correct else None
        return {
            **record,
            "tokens": int(first.tokens),
            "ppl_clean": float(first.ppl_clean),
            "correct_clean": clean,
            "runs": runs,
            **scope,
        }

    def validate(self, record: dict, where: str, fix: str) -> None:
        """Types, ranges and identities: a skipped example holds no runs and no perplexity; a finished one a finite
        positive ``ppl_clean``, and in each run a known measure and curve, a rate from 0 to 100 %, a positive (or NaN)
        ``ppl_masked``, ``delta_ppl`` = ``ppl_masked`` - ``ppl_clean``, and answers of 0 or 1 (set for a
        multiple-choice task's runs, null for text's)."""
        for number, run in enumerate(record["runs"], start=1):
            run.setdefault("draw", 0)  # absent in records made before the random control had draws: one draw
            check_fields(run, RUN, f"{where}, run {number}", fix)
        in_range(record["tokens"], 0, math.inf, where, "tokens", fix, what="a count")
        scope = record.setdefault("rank_scope", RANK_SCOPES[0])  # absent in records made before scopes: query
        if scope not in RANK_SCOPES:
            raise InputError(
                f"{where}: 'rank_scope' must be one of {', '.join(RANK_SCOPES)}, not {shown(scope)}; {fix}"
            )
        if record["skipped"]:
            if record["runs"] or record["ppl_clean"] is not None or record["correct_clean"] is not None:
                raise InputError(f"{where}: a skipped example holds no runs, perplexity or answer; {fix}")
            return
        clean = record["ppl_clean"]
        if not is_number(clean) or not math.isfinite(clean) or clean <= 0:
            raise InputError(
                f"{where}: a finished example's 'ppl_clean' must be a finite positive number, not {shown(clean)}; {fix}"
            )
        answers = record["correct_clean"] is not None
        if answers and record["correct_clean"] not in (0, 1):
            raise InputError(f"{where}: 'correct_clean' must be 0 or 1, not {shown(record['correct_clean'])}; {fix}")
        for number, run in enumerate(record["runs"], start=1):
            at = f"{where}, run {number}"
            if run["measure"] not in faithfulness.ALL_MEASURES or run["curve"] not in faithfulness.CURVES:
                raise InputError(
                    f"{at}: unknown measure or curve ({shown(run['measure'])}, {shown(run['curve'])}); {fix}"
                )
            in_range(run["rate"], 0, 100, at, "rate", fix, what="a percentage")
            in_range(run["ppl_masked"], 0, math.inf, at, "ppl_masked", fix, nan=True)
            if not agrees(run["delta_ppl"], run["ppl_masked"] - clean):
                raise InputError(
                    f"{at}: 'delta_ppl' {run['delta_ppl']:g} is not ppl_masked - ppl_clean "
                    f"({run['ppl_masked']:g} - {clean:g} = {run['ppl_masked'] - clean:g}); {fix}"
                )
            if (run["correct_masked"] is not None) != answers or run["correct_masked"] not in (None, 0, 1):
                raise InputError(
                    f"{at}: 'correct_masked' must be 0 or 1 where 'correct_clean' is set, null where not; {fix}"
                )

    def validate_run(self, records: list[dict], manifest: dict | None, folder: Path, fix: str) -> None:
        """One rank scope, and every finished record holds the same masked runs (measure, curve, rate), once each:
        the manifest's measures and rates when it names them."""
        scopes = {r["rank_scope"] for r in records}
        if len(scopes) > 1:  # the query scope is left out of the fingerprint, so the fingerprint alone cannot tell
            raise InputError(f"{folder} holds records of different rank scopes ({', '.join(sorted(scopes))}); {fix}")
        grids = {}
        for record in records:
            if record["skipped"]:
                continue
            runs = [(run["measure"], run["curve"], run["rate"], run["draw"]) for run in record["runs"]]
            if len(set(runs)) != len(runs) or not runs:
                raise InputError(
                    f"{folder}: the record of example {record['example']} holds a masked run twice, or none; {fix}"
                )
            grids.setdefault(frozenset(runs), record["example"])
        if len(grids) > 1:
            first, second = list(grids.values())[:2]
            raise InputError(
                f"{folder}: examples {first} and {second} hold different masked runs (measures, curves or rates); {fix}"
            )
        if grids and manifest is not None:
            (grid,) = grids
            measures, rates = {m for m, _, _, _ in grid}, {float(r) for _, _, r, _ in grid}
            if measures != set(manifest["measures"]) or rates != {float(r) for r in manifest["rates"]}:
                raise InputError(
                    f"{folder / MANIFEST} names measures {', '.join(manifest['measures'])} at rates "
                    f"{', '.join(f'{r:g}' for r in manifest['rates'])}, but the records hold measures "
                    f"{', '.join(sorted(measures))} at rates {', '.join(f'{r:g}' for r in sorted(rates))}; restore the "
                    f"manifest of the run that wrote the records, or {fix}"
                )

    def describe(self, records: list[dict]) -> str:
        """The rates and measures of the records' runs."""
        runs = [run for record in records for run in record["runs"]]
        rates = sorted({run["rate"] for run in runs})
        measures = sorted({run["measure"] for run in runs})
        return f"; rates {', '.join(f'{r:g}' for r in rates)}; measures {', '.join(measures)}" if runs else ""

    def decode(self, records: Sequence[dict]) -> pd.DataFrame:
        """The per-example table (one row per example and masked run) of the records that were not skipped: the
        columns of :data:`cwviz.analyses.faithfulness.EXAMPLE_COLUMNS`, plus ``correct_clean`` and ``correct_masked``
        for multiple-choice tasks."""
        rows = []
        for record in records:
            for run in record["runs"]:
                row = {
                    "example": record["example"],
                    "measure": run["measure"],
                    "curve": run["curve"],
                    "rate": run["rate"],
                    "draw": run.get("draw", 0),
                    "tokens": record["tokens"],
                    "ppl_clean": record["ppl_clean"],
                    "ppl_masked": run["ppl_masked"],
                    "delta_ppl": run["delta_ppl"],
                    "log_ppl_ratio": float(faithfulness_summary.log_ratio(run["ppl_masked"], record["ppl_clean"])),
                }
                if record.get("correct_clean") is not None:
                    row["correct_clean"], row["correct_masked"] = record["correct_clean"], run["correct_masked"]
                rows.append(row)
        frame = pd.DataFrame(rows)
        return frame if len(frame) else pd.DataFrame(columns=faithfulness.EXAMPLE_COLUMNS)

    def summary(self, records: Sequence[dict], seed: int = 0) -> pd.DataFrame:
        """The summary (:func:`cwviz.analyses.faithfulness_summary.summarize`) of the records' finished examples (none:
        empty)."""
        table = self.decode(records)
        if not len(table):
            return pd.DataFrame(columns=faithfulness_summary.SUMMARY_COLUMNS)
        return faithfulness_summary.summarize(table, seed=seed)


# -- sinks -----------------------------------------------------------------------------------------------
#: The integer and float32 columns of a sinks record's table (numpy arrays in memory, lists in a file:
#: :func:`cwviz.analyses.records.as_json`); ``sink_attention_share`` is ``sink_ratio`` by definition, ``token`` and
#: ``sink`` come from the record.
SINK_INTS = ("layer", "head", "query", "other_keys")
SINK_FLOATS = (
    "sink_ratio",
    "output_norm",
    "sink_value_norm",
    "rest_norm",
    "cos_sink_rest",
    "sink_contribution_share",
    "sink_contribution_inter",
    "learned_sink_share",
)


class SinksCodec(Codec):
    """``cwviz sinks`` and the Sinks page's pooled prompts: one prompt's whole sink table a record."""

    name = "sinks"
    payload = {
        "sink": INT,
        "tokens": (list_of(lambda v: isinstance(v, str)), "a list of token texts"),
        "ppl": (optional(list_of(is_number)), "a list of numbers or null"),
        "ppl_clean": (optional(is_number), "a number or null"),
        "table": ((lambda v: isinstance(v, dict)), "an object of columns"),
    }
    manifest_fields = {"fingerprint": TEXT, "factor": NUMBER}

    def settings(self, sink: str, factor: float, ppl: bool, provenance: dict) -> dict:
        """What decides a record's numbers: the sink asked for, λ and whether ΔPPL runs, and the model."""
        return {
            "sink": str(sink).strip().lower(),
            "factor": float(factor),
            "ppl": bool(ppl),
            "model": model_settings(provenance),
        }

    def encode(
        self,
        table: pd.DataFrame,
        sink: int,
        tokens: Sequence[str],
        ppl: np.ndarray | None = None,
        clean: float | None = None,
    ) -> dict:
        """One prompt's payload: its whole :func:`~cwviz.analyses.sinks.sink_table` (one row per layer, head and query
        that sees the sink; about 12 numbers a row, kept as numpy columns until written), its tokens, and with ΔPPL the
        perplexities with the sink's value scaled in each layer, then in all (``ppl``, [layers + 1]), and the clean
        one."""
        columns = {name: table[name].to_numpy(np.int64, copy=True) for name in SINK_INTS}
        columns |= {name: table[name].to_numpy(np.float32, copy=True) for name in SINK_FLOATS}
        return {
            "sink": int(sink),
            "tokens": list(tokens),
            "ppl": None if ppl is None else [float(p) for p in ppl],
            "ppl_clean": None if clean is None else float(clean),
            "table": columns,
        }

    def validate(self, record: dict, where: str, fix: str) -> None:
        columns = record["table"]
        for name in (*SINK_INTS, *SINK_FLOATS):
            check_fields(
                columns,
                {name: (list_of(is_int if name in SINK_INTS else is_number), "a list of numbers")},
                f"{where}, table",
                fix,
            )
        tokens = len(record["tokens"])
        if not 0 <= record["sink"] < tokens or any(not 0 <= q < tokens for q in columns["query"]):
            raise InputError(f"{where}: its sink or queries lie outside its {tokens} tokens; {fix}")
        same_length(columns, where, fix)
        for name in ("layer", "head", "other_keys"):
            in_range(columns[name], 0, math.inf, f"{where}, table", name, fix, what="a count")
        for name in ("sink_ratio", "learned_sink_share"):  # shares of a head's attention
            in_range(columns[name], 0, 1, f"{where}, table", name, fix, what="a share")
        for name in ("output_norm", "sink_value_norm", "rest_norm"):
            # NaN: no other key
            in_range(columns[name], 0, math.inf, f"{where}, table", name, fix, nan=True, what="a norm")
        in_range(columns["cos_sink_rest"], -1, 1, f"{where}, table", "cos_sink_rest", fix, nan=True, what="a cosine")
        for name in ("sink_contribution_share", "sink_contribution_inter"):  # signed weights, of any size
            in_range(columns[name], -math.inf, math.inf, f"{where}, table", name, fix, nan=True)
        clean, ppl = record["ppl_clean"], record["ppl"]
        if (clean is None) != (ppl is None):
            raise InputError(f"{where}: 'ppl' and 'ppl_clean' are both set (with ΔPPL) or both null; {fix}")
        if ppl is not None:
            layers = len(set(columns["layer"]))
            if columns["layer"] and len(ppl) != max(columns["layer"]) + 2 and len(ppl) != layers + 1:
                raise InputError(f"{where}: 'ppl' must hold one perplexity per layer and one for all layers; {fix}")
            in_range([clean, *ppl], 0, math.inf, where, "ppl", fix, nan=True, what="a perplexity")

    def decode(self, record: dict) -> pd.DataFrame:
        """The :func:`~cwviz.analyses.sinks.sink_table` a record holds, columns and dtypes as made."""
        columns = record["table"]
        frame = pd.DataFrame({name: np.asarray(columns[name], dtype=np.int64) for name in SINK_INTS})
        for name in SINK_FLOATS:
            frame[name] = np.asarray(columns[name], dtype=np.float32)
        frame["sink_attention_share"] = frame["sink_ratio"]
        frame["sink"] = np.int64(record["sink"])
        frame["token"] = np.asarray(record["tokens"], dtype=object)[frame["query"].to_numpy()]
        return frame[list(TABLE_COLUMNS)]


# -- atlas -----------------------------------------------------------------------------------------------
class AtlasCodec(Codec):
    """``cwviz atlas`` and the Atlas page: one prompt's per-head statistics a record."""

    name = "atlas"
    payload = {
        "tokens": INT,
        "layer": (list_of(is_int), "a list of integers"),
        "head": (list_of(is_int), "a list of integers"),
        **{name: (list_of(is_number), "a list of numbers") for name in ATLAS_METRICS},
    }
    manifest_fields = {
        "fingerprint": TEXT,
        "bootstrap": COUNT,
        "confidence": (lambda v: is_number(v) and 0 < v < 1, "a number between 0 and 1"),
        "seed": INT,
        "data": data_count("prompts"),
    }

    def settings(self, sink: int, provenance: dict) -> dict:
        """What decides a record's numbers: the sink and the model (the bootstrap pools the records; it decides
        none)."""
        return {"sink": sink, "model": model_settings(provenance)}

    def encode(self, frame: pd.DataFrame) -> dict:
        """One prompt's payload: its :func:`~cwviz.analyses.atlas.prompt_stats` (one row per layer and head)."""
        return {
            "tokens": int(frame["tokens"].iloc[0]),
            "layer": frame["layer"].astype(np.int64).tolist(),
            "head": frame["head"].astype(np.int64).tolist(),
            **{name: [float(v) for v in frame[name]] for name in ATLAS_METRICS},
        }

    def validate(self, record: dict, where: str, fix: str) -> None:
        """Columns of one length; counts ≥ 0; the attention and negative shares in [0, 1], the divergence and norm ≥ 0,
        the cosine in [-1, 1] or NaN (no query saw the sink); the contribution share (signed weights) finite."""
        same_length({k: record[k] for k in ("layer", "head", *ATLAS_METRICS)}, where, fix)
        in_range(record["tokens"], 1, math.inf, where, "tokens", fix, what="a count")
        for name in ("layer", "head"):
            in_range(record[name], 0, math.inf, where, name, fix, what="an index")
        for name in ("sink_attention", "negative_share"):
            in_range(record[name], 0, 1, where, name, fix, what="a share")
        for name in ("divergence", "output_norm"):
            in_range(record[name], 0, math.inf, where, name, fix)
        in_range(record["cos_sink_rest"], -1, 1, where, "cos_sink_rest", fix, nan=True, what="a cosine")
        in_range(record["sink_contribution"], -math.inf, math.inf, where, "sink_contribution", fix)

    def validate_run(self, records: list[dict], manifest: dict | None, folder: Path, fix: str) -> None:
        if len({(tuple(r["layer"]), tuple(r["head"])) for r in records}) > 1:
            raise InputError(
                f"{folder} holds atlas records of different (layer, head) grids (another model's, or edited); {fix}"
            )

    def decode(self, records: Sequence[dict]) -> pd.DataFrame:
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


FAITHFULNESS, SINKS, ATLAS = FaithfulnessCodec(), SinksCodec(), AtlasCodec()
