"""One codec per record type: what a record of faithfulness, sinks, the atlas or the claims holds, in one place.

A record type's codec is the type itself: its ``name`` (``cwviz.<name>.record``), what decides its records' numbers
(``settings``: their fingerprint), ``encode`` (a payload from the tables one item gave), the checks a record read
back must pass (``payload``: keys and types; ``validate``: ranges and lengths; ``validate_run``: what the records of
one folder must share; ``manifest_fields``: its manifest's keys), and ``decode`` (the records back to the tables).
:mod:`cwviz.analyses.records` keeps the file format around them (envelope, writer, reader, locks, manifests) and
:mod:`cwviz.analyses.sweep` the runner; a check a record type needs goes into its codec, never into either.

A faithfulness record's payload (:meth:`FaithfulnessCodec.encode`; a multiple-choice task's item is a faithfulness
record whose ``task`` names it and whose ``correct_*`` fields are set) is

    {"task": "text" | "mmlu" | ..., "skipped": bool, "tokens": int, "ppl_clean": float, "correct_clean": 0 | 1 | null,
     "runs": [{"measure", "curve", "rate", "ppl_masked", "delta_ppl", "correct_masked"}, ...],
     "rank_scope": "query" | "token" | "layer"}  (absent in records made before scopes: query)

a sinks record's a prompt's whole sink table (:meth:`SinksCodec.encode`), an atlas record's a prompt's per-head
statistics (:meth:`AtlasCodec.encode`), and a claims record's every rank scope's faithfulness payload and the
item's sink statistics (:meth:`ClaimsCodec.encode`), and a flow-faithfulness record's an item's knockout effects, each
method's scores and the drops of its removals (:meth:`FlowFaithfulnessCodec.encode`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.defaults import SINK_ACTIVE_THRESHOLDS
from ..core.util.errors import InputError
from . import faithfulness
from .codec import COUNT, NAMES, NUMBERS, Codec, agrees, data_count, in_range, model_settings, same_length
from .records import (
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
from .schema import ATLAS_METRICS, FLOW_MIN_TOKENS, RANK_SCOPES
from .sinks import TABLE_COLUMNS

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
    manifest_fields = {"fingerprint": TEXT, "seed": INT, "rates": NUMBERS, "measures": NAMES, "data": data_count("examples")}

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
        return {**record, "tokens": int(first.tokens), "ppl_clean": float(first.ppl_clean), "correct_clean": clean, "runs": runs, **scope}

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
            raise InputError(f"{where}: 'rank_scope' must be one of {', '.join(RANK_SCOPES)}, not {shown(scope)}; {fix}")
        if record["skipped"]:
            if record["runs"] or record["ppl_clean"] is not None or record["correct_clean"] is not None:
                raise InputError(f"{where}: a skipped example holds no runs, perplexity or answer; {fix}")
            return
        clean = record["ppl_clean"]
        if not is_number(clean) or not math.isfinite(clean) or clean <= 0:
            raise InputError(f"{where}: a finished example's 'ppl_clean' must be a finite positive number, not {shown(clean)}; {fix}")
        answers = record["correct_clean"] is not None
        if answers and record["correct_clean"] not in (0, 1):
            raise InputError(f"{where}: 'correct_clean' must be 0 or 1, not {shown(record['correct_clean'])}; {fix}")
        for number, run in enumerate(record["runs"], start=1):
            at = f"{where}, run {number}"
            if run["measure"] not in faithfulness.ALL_MEASURES or run["curve"] not in faithfulness.CURVES:
                raise InputError(f"{at}: unknown measure or curve ({shown(run['measure'])}, {shown(run['curve'])}); {fix}")
            in_range(run["rate"], 0, 100, at, "rate", fix, what="a percentage")
            in_range(run["ppl_masked"], 0, math.inf, at, "ppl_masked", fix, nan=True)
            if not agrees(run["delta_ppl"], run["ppl_masked"] - clean):
                raise InputError(
                    f"{at}: 'delta_ppl' {run['delta_ppl']:g} is not ppl_masked - ppl_clean "
                    f"({run['ppl_masked']:g} - {clean:g} = {run['ppl_masked'] - clean:g}); {fix}"
                )
            if (run["correct_masked"] is not None) != answers or run["correct_masked"] not in (None, 0, 1):
                raise InputError(f"{at}: 'correct_masked' must be 0 or 1 where 'correct_clean' is set, null where not; {fix}")

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
                raise InputError(f"{folder}: the record of example {record['example']} holds a masked run twice, or none; {fix}")
            grids.setdefault(frozenset(runs), record["example"])
        if len(grids) > 1:
            first, second = list(grids.values())[:2]
            raise InputError(f"{folder}: examples {first} and {second} hold different masked runs (measures, curves or rates); {fix}")
        if grids and manifest is not None:
            (grid,) = grids
            measures, rates = {m for m, _, _, _ in grid}, {float(r) for _, _, r, _ in grid}
            if measures != set(manifest["measures"]) or rates != {float(r) for r in manifest["rates"]}:
                raise InputError(
                    f"{folder / MANIFEST} names measures {', '.join(manifest['measures'])} at rates "
                    f"{', '.join(f'{r:g}' for r in manifest['rates'])}, but the records hold measures {', '.join(sorted(measures))} "
                    f"at rates {', '.join(f'{r:g}' for r in sorted(rates))}; restore the manifest of the run that wrote the records, or {fix}"
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
                    "log_ppl_ratio": float(faithfulness.log_ratio(run["ppl_masked"], record["ppl_clean"])),
                }
                if record.get("correct_clean") is not None:
                    row["correct_clean"], row["correct_masked"] = record["correct_clean"], run["correct_masked"]
                rows.append(row)
        frame = pd.DataFrame(rows)
        return frame if len(frame) else pd.DataFrame(columns=faithfulness.EXAMPLE_COLUMNS)

    def summary(self, records: Sequence[dict], seed: int = 0) -> pd.DataFrame:
        """The summary (:func:`cwviz.analyses.faithfulness.summarize`) of the records' finished examples (none: empty)."""
        table = self.decode(records)
        return faithfulness.summarize(table, seed=seed) if len(table) else pd.DataFrame(columns=faithfulness.SUMMARY_COLUMNS)


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
        return {"sink": str(sink).strip().lower(), "factor": float(factor), "ppl": bool(ppl), "model": model_settings(provenance)}

    def encode(
        self, table: pd.DataFrame, sink: int, tokens: Sequence[str], ppl: np.ndarray | None = None, clean: float | None = None
    ) -> dict:
        """One prompt's payload: its whole :func:`~cwviz.analyses.sinks.sink_table` (one row per layer, head and
        query that sees the sink; about 12 numbers a row, kept as numpy columns until written), its tokens, and with ΔPPL the perplexities with the sink's
        value scaled in each layer, then in all (``ppl``, [layers + 1]), and the clean one."""
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
                columns, {name: (list_of(is_int if name in SINK_INTS else is_number), "a list of numbers")}, f"{where}, table", fix
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
            in_range(columns[name], 0, math.inf, f"{where}, table", name, fix, nan=True, what="a norm")  # NaN: no other key
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
        """What decides a record's numbers: the sink and the model (the bootstrap pools the records; it decides none)."""
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
            raise InputError(f"{folder} holds atlas records of different (layer, head) grids (another model's, or edited); {fix}")

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


# -- claims ----------------------------------------------------------------------------------------------
#: A claims record's sink statistics (:func:`cwviz.analyses.claim_items.sink_statistics`) and the range of each.
_COS, _CHANGE, _SHARE, _ANY = (-1, 1), (-2, 2), (0, 1), (-math.inf, math.inf)
SINK_STAT_RANGES: dict[str, tuple[float, float]] = {
    "rho_geometry": _COS,
    "rho_attention": _COS,
    "rho_geometry_other": _COS,
    "rho_attention_other": _COS,
    "cos_sink_rest": _COS,
    **{f"cos_active_{tau:g}": _COS for tau in SINK_ACTIVE_THRESHOLDS},
    "cos_weighted": _COS,
    "interior_minimum_share": _SHARE,
    "median_minimiser": _ANY,
    "u_shaped_share": _SHARE,
    "fitted_heads": (0, math.inf),
    "fit_minimiser": _ANY,
    "operating_ratio": _SHARE,
    "above_minimum_share": _SHARE,
    "operating_distance": _SHARE,
    "operating_offset": (-1, 1),
    "operating_heads": (0, math.inf),
    "cone_change": _CHANGE,
    "low_cone_change": _CHANGE,
    "low_centroid_change": _CHANGE,
    "log_ppl_ratio": _ANY,
    "delta_ppl": _ANY,
    "control_low_cone_change": _CHANGE,
    "control_low_centroid_change": _CHANGE,
    "control_log_ppl_ratio": _ANY,
    "control_delta_ppl": _ANY,
    "control_in_band_share": _SHARE,
    "control_mass_ratio": (0, math.inf),
}
SINK_STATS = tuple(SINK_STAT_RANGES)
#: Bumped when what a claims record means changes (2: issue 45's protocol; 3: issue 59's claim-4 operating point and
#: claim-5 control), so a resume refuses older records.
CLAIMS_VERSION = 3


class ClaimsCodec(Codec):
    """``cwviz claims`` and the Claims page: one item's faithfulness runs under every rank scope and its sink statistics."""

    name = "claims"
    payload = {
        "skipped": FLAG,
        "tokens": INT,
        "faithfulness": ((lambda v: isinstance(v, dict)), "an object of rank scopes"),
        "sinks": ((lambda v: isinstance(v, dict)), "an object of statistics"),
    }
    manifest_fields = {"fingerprint": TEXT, "seed": INT, "rates": NUMBERS, "scopes": NAMES, "data": data_count("examples")}

    def settings(self, protocol, scopes: Sequence[str], sink, provenance: dict) -> dict:
        """What decides a record's numbers: the protocol (not its batch size or scope), the scopes, the sink, the model."""
        kept = {k: v for k, v in asdict(protocol).items() if k not in ("batch_size", "rank_scope")}
        made = {"protocol": kept, "scopes": list(scopes), "sink": str(sink), "version": CLAIMS_VERSION}
        return made | {"model": model_settings(provenance)}

    def encode(self, tokens: int, tables: dict[str, pd.DataFrame] | None = None, stats: dict | None = None) -> dict:
        """One item's payload: each rank scope's per-example table (a faithfulness payload) and its sink statistics
        (:func:`cwviz.analyses.claim_items.sink_statistics`); ``tables`` None: skipped (too short)."""
        if tables is None:
            return {"skipped": True, "tokens": tokens, "faithfulness": {}, "sinks": {}}
        faithful = {scope: FAITHFULNESS.encode("text", table) for scope, table in tables.items()}
        return {"skipped": False, "tokens": tokens, "faithfulness": faithful, "sinks": stats or {}}

    def validate(self, record: dict, where: str, fix: str) -> None:
        """A skipped item holds nothing; a finished one a faithfulness payload per known rank scope (each checked as a
        faithfulness record is: :meth:`FaithfulnessCodec.validate`) and its sink statistics, numbers in their ranges."""
        in_range(record["tokens"], 0, math.inf, where, "tokens", fix, what="a count")
        if record["skipped"]:
            if record["faithfulness"] or record["sinks"]:
                raise InputError(f"{where}: a skipped item holds no runs or statistics; {fix}")
            return
        for scope, payload in record["faithfulness"].items():
            at = f"{where}, scope {scope}"
            if scope not in RANK_SCOPES or not isinstance(payload, dict):
                raise InputError(f"{at}: a rank scope ({', '.join(RANK_SCOPES)}) with a faithfulness payload, not {shown(scope)}; {fix}")
            check_fields(payload, FAITHFULNESS.payload, at, fix)
            FAITHFULNESS.validate({**payload, "rank_scope": scope}, at, fix)
        stats = record["sinks"]
        check_fields(stats, {name: NUMBER for name in SINK_STATS}, f"{where}, sinks", fix)
        for name, (low, high) in SINK_STAT_RANGES.items():
            in_range(stats[name], low, high, f"{where}, sinks", name, fix, nan=True)

    def decode(self, records: Sequence[dict], scope: str, value: str = "log_ppl_ratio") -> pd.DataFrame:
        """``value`` (``log_ppl_ratio`` or ``delta_ppl``) of each finished item under ``scope``, the random control's
        draws averaged within the item: rows item, columns (curve, rate, measure)."""
        rows = [
            (
                record["example"],
                run["curve"],
                run["rate"],
                run["measure"],
                run["delta_ppl"],
                float(faithfulness.log_ratio(run["ppl_masked"], payload["ppl_clean"])),
            )
            for record in records
            if not record.get("skipped")
            for payload in [record["faithfulness"].get(scope, {})]
            for run in payload.get("runs", [])
        ]
        frame = pd.DataFrame(rows, columns=["example", "curve", "rate", "measure", "delta_ppl", "log_ppl_ratio"])
        return frame.pivot_table(index="example", columns=["curve", "rate", "measure"], values=value, aggfunc="mean")


# -- flow faithfulness ----------------------------------------------------------------------------------
_SCORES: Field = (lambda v: isinstance(v, dict) and all(list_of(is_number)(s) for s in v.values()), "an object of score lists")


def _RATES_OF(r) -> bool:  # noqa: N802 - read as the field checks beside it
    return isinstance(r, dict) and all(is_number(x) for x in r.values())


_CURVES: Field = (
    lambda v: (
        isinstance(v, dict)
        and all(
            isinstance(m, dict) and all(isinstance(c, dict) and all(_RATES_OF(r) for r in c.values()) for c in m.values())
            for m in v.values()
        )
    ),
    "an object: intervention -> method -> curve -> rate -> drop",
)
_PER_INTERVENTION: Field = (lambda v: isinstance(v, dict) and all(list_of(is_number)(s) for s in v.values()), "an object of number lists")
_NUMBER_PER_INTERVENTION: Field = (lambda v: isinstance(v, dict) and all(is_number(x) for x in v.values()), "an object of numbers")
#: The keys and types of a finished flow-faithfulness item (a skipped one holds ``why`` and ``tokens`` alone).
FLOW_ITEM: dict[str, Field] = {
    "target": INT,
    "foil": INT,
    "ld_clean": NUMBER,
    "logp_clean": NUMBER,
    "full_drop": _NUMBER_PER_INTERVENTION,
    "effects": _PER_INTERVENTION,
    "logp_effects": _PER_INTERVENTION,
    "scores": _SCORES,
    "signed": (list_of(lambda x: isinstance(x, str)), "a list of method names"),
    "random_scores": (list_of(list_of(is_number)), "a list of score lists"),
    "curves": _CURVES,
}


class FlowFaithfulnessCodec(Codec):
    """``cwviz flow-faithfulness``: one item's knockout effects, each method's scores of its input tokens and the
    drops of each method's removals (:func:`cwviz.analyses.flow_faithfulness.item_payload`)."""

    name = "flow_faithfulness"
    payload = {"skipped": FLAG, "tokens": INT}
    manifest_fields = {"fingerprint": TEXT, "seed": INT, "data": data_count("examples")}

    def settings(self, max_tokens: int, draws: int, seed: int, rates, tie_tolerance: float, version: int, provenance: dict) -> dict:
        """What decides a record's numbers: the cap, the random draws and seed, the rates, the tie rule, the record's
        version and the model (not the batch size or the device)."""
        made = {"max_tokens": max_tokens, "draws": draws, "seed": seed, "rates": list(rates)}
        return made | {"tie_tolerance": tie_tolerance, "version": version, "model": model_settings(provenance)}

    def encode(self, payload: dict) -> dict:
        """One item's payload as :func:`~cwviz.analyses.flow_faithfulness.item_payload` made it (plain numbers and
        lists already): checked here so that a record that could not be read back is never written."""
        check_fields(payload, self.payload, "a flow-faithfulness item", "this is a bug in cwviz")
        self.validate(payload, "a flow-faithfulness item", "this is a bug in cwviz")
        return payload

    def validate(self, record: dict, where: str, fix: str) -> None:
        if record["tokens"] < 0:
            raise InputError(f"{where}: 'tokens' must not be negative, not {shown(record['tokens'])}; {fix}")
        if record["skipped"]:
            check_fields(record, {"why": TEXT}, where, fix)
            return
        check_fields(record, FLOW_ITEM, where, fix)
        inputs = record["tokens"] - 1  # the input tokens 0 .. t - 1 before the target position t
        if record["tokens"] < FLOW_MIN_TOKENS:
            raise InputError(f"{where}: a finished item has {FLOW_MIN_TOKENS} or more tokens, not {record['tokens']}; {fix}")
        if record["target"] < 0 or record["foil"] < 0 or record["target"] == record["foil"]:
            raise InputError(f"{where}: 'target' and 'foil' must be two token ids, not {record['target']} and {record['foil']}; {fix}")
        lists = {
            **{("effects", k): v for k, v in record["effects"].items()},
            **{("logp_effects", k): v for k, v in record["logp_effects"].items()},
            **record["scores"],
            **dict(enumerate(record["random_scores"])),
        }
        if any(len(v) != inputs for v in lists.values()) or "effect" not in record["scores"]:
            raise InputError(
                f"{where}: its effects and scores must hold one number per input token ({inputs}), the effect flow's among them; {fix}"
            )

    def validate_run(self, records: list[dict], manifest: dict | None, folder: Path, fix: str) -> None:
        """Every finished item holds the same methods, curves and rates."""
        grids = {
            (
                frozenset(r["scores"]),
                frozenset(
                    (i, m, c, rate)
                    for i, methods in r["curves"].items()
                    for m, curves in methods.items()
                    for c, rates in curves.items()
                    for rate in rates
                ),
            )
            for r in records
            if not r["skipped"]
        }
        if len(grids) > 1:
            raise InputError(f"{folder} holds flow-faithfulness records of different methods, curves or rates; {fix}")

    def decode(self, records: Sequence[dict]) -> pd.DataFrame:
        """The effects of the finished items: one row per item and input token (example, position, each
        intervention's effect ``effect_<intervention>`` and ``logp_effect_<intervention>``, then each method's score)."""
        frames = [
            pd.DataFrame(
                {
                    "example": record["example"],
                    "position": np.arange(record["tokens"] - 1, dtype=np.int64),
                    **{f"effect_{k}": np.asarray(v, dtype=np.float64) for k, v in record["effects"].items()},
                    **{f"logp_effect_{k}": np.asarray(v, dtype=np.float64) for k, v in record["logp_effects"].items()},
                    **{name: np.asarray(v, dtype=np.float64) for name, v in record["scores"].items()},
                }
            )
            for record in records
            if not record["skipped"]
        ]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["example", "position"])


FAITHFULNESS, SINKS, ATLAS, CLAIMS = FaithfulnessCodec(), SinksCodec(), AtlasCodec(), ClaimsCodec()
FLOW_FAITHFULNESS = FlowFaithfulnessCodec()
#: Every record type by its name (``cwviz.<name>.record``).
BY_NAME: dict[str, Codec] = {codec.name: codec for codec in (FAITHFULNESS, SINKS, ATLAS, CLAIMS, FLOW_FAITHFULNESS)}
