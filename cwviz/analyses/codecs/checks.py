"""The codecs of the pre-registered checks' records: ``cwviz claims`` (and the Claims page) and
``cwviz flow-faithfulness``. What a codec is: :mod:`cwviz.analyses.codecs`.

A claims record's payload holds every rank scope's faithfulness payload (:mod:`cwviz.analyses.codecs.sweeps`) and the
item's sink statistics (:meth:`ClaimsCodec.encode`); a flow-faithfulness record's an item's knockout effects, each
method's scores and the drops of its removals (:meth:`FlowFaithfulnessCodec.encode`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.defaults import SINK_ACTIVE_THRESHOLDS
from ...core.util.errors import InputError
from .. import faithfulness_summary
from ..records import (
    FLAG,
    INT,
    NUMBER,
    TEXT,
    Field,
    check_fields,
    is_number,
    list_of,
    shown,
)
from ..schema import FLOW_MIN_TOKENS, RANK_SCOPES
from .base import NAMES, NUMBERS, Codec, data_count, in_range, model_settings
from .sweeps import FAITHFULNESS

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
    """``cwviz claims`` and the Claims page: one item's faithfulness runs under every rank scope and its sink
    statistics."""

    name = "claims"
    payload = {
        "skipped": FLAG,
        "tokens": INT,
        "faithfulness": ((lambda v: isinstance(v, dict)), "an object of rank scopes"),
        "sinks": ((lambda v: isinstance(v, dict)), "an object of statistics"),
    }
    manifest_fields = {
        "fingerprint": TEXT,
        "seed": INT,
        "rates": NUMBERS,
        "scopes": NAMES,
        "data": data_count("examples"),
    }

    def settings(self, protocol, scopes: Sequence[str], sink, provenance: dict) -> dict:
        """What decides a record's numbers: the protocol (not its batch size or scope), the scopes, the sink, the
        model."""
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
        faithfulness record is: :meth:`~cwviz.analyses.codecs.sweeps.FaithfulnessCodec.validate`) and its sink
        statistics, numbers in their ranges."""
        in_range(record["tokens"], 0, math.inf, where, "tokens", fix, what="a count")
        if record["skipped"]:
            if record["faithfulness"] or record["sinks"]:
                raise InputError(f"{where}: a skipped item holds no runs or statistics; {fix}")
            return
        for scope, payload in record["faithfulness"].items():
            at = f"{where}, scope {scope}"
            if scope not in RANK_SCOPES or not isinstance(payload, dict):
                raise InputError(
                    f"{at}: a rank scope ({', '.join(RANK_SCOPES)}) with a faithfulness payload, not "
                    f"{shown(scope)}; {fix}"
                )
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
                float(faithfulness_summary.log_ratio(run["ppl_masked"], payload["ppl_clean"])),
            )
            for record in records
            if not record.get("skipped")
            for payload in [record["faithfulness"].get(scope, {})]
            for run in payload.get("runs", [])
        ]
        frame = pd.DataFrame(rows, columns=["example", "curve", "rate", "measure", "delta_ppl", "log_ppl_ratio"])
        return frame.pivot_table(index="example", columns=["curve", "rate", "measure"], values=value, aggfunc="mean")


# -- flow faithfulness ----------------------------------------------------------------------------------
_SCORES: Field = (
    lambda v: isinstance(v, dict) and all(list_of(is_number)(s) for s in v.values()),
    "an object of score lists",
)


def _RATES_OF(r) -> bool:  # noqa: N802 - read as the field checks beside it
    return isinstance(r, dict) and all(is_number(x) for x in r.values())


_CURVES: Field = (
    lambda v: (
        isinstance(v, dict)
        and all(
            isinstance(m, dict)
            and all(isinstance(c, dict) and all(_RATES_OF(r) for r in c.values()) for c in m.values())
            for m in v.values()
        )
    ),
    "an object: intervention -> method -> curve -> rate -> drop",
)
_PER_INTERVENTION: Field = (
    lambda v: isinstance(v, dict) and all(list_of(is_number)(s) for s in v.values()),
    "an object of number lists",
)
_NUMBER_PER_INTERVENTION: Field = (
    lambda v: isinstance(v, dict) and all(is_number(x) for x in v.values()),
    "an object of numbers",
)
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

    def settings(
        self, max_tokens: int, draws: int, seed: int, rates, tie_tolerance: float, version: int, provenance: dict
    ) -> dict:
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
            raise InputError(
                f"{where}: a finished item has {FLOW_MIN_TOKENS} or more tokens, not {record['tokens']}; {fix}"
            )
        if record["target"] < 0 or record["foil"] < 0 or record["target"] == record["foil"]:
            raise InputError(
                f"{where}: 'target' and 'foil' must be two token ids, not {record['target']} and "
                f"{record['foil']}; {fix}"
            )
        lists = {
            **{("effects", k): v for k, v in record["effects"].items()},
            **{("logp_effects", k): v for k, v in record["logp_effects"].items()},
            **record["scores"],
            **dict(enumerate(record["random_scores"])),
        }
        if any(len(v) != inputs for v in lists.values()) or "effect" not in record["scores"]:
            raise InputError(
                f"{where}: its effects and scores must hold one number per input token ({inputs}), the effect flow's "
                f"among them; {fix}"
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
        """The effects of the finished items: one row per item and input token (example, position, each intervention's
        effect ``effect_<intervention>`` and ``logp_effect_<intervention>``, then each method's score)."""
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


CLAIMS, FLOW_FAITHFULNESS = ClaimsCodec(), FlowFaithfulnessCodec()
