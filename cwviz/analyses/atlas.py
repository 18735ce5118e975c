"""Atlas: every head's behaviour pooled over many prompts, with bootstrap intervals.

Per prompt (:func:`prompt_stats`: one forward pass, each layer read in row blocks and reduced as it goes,
never a layer's [head, T, T] maps), one row per (layer, head), each a mean over the queries 1..T-1 (query 0
sees only itself), the sink being the first token (docs/METHOD.md section 4):

| column            | per query i, then averaged over queries                                             |
|-------------------|--------------------------------------------------------------------------------------|
| sink_attention    | α_i0^h, the sink's share under attention                                             |
| sink_contribution | c_i0^h, its intra-head contribution weight                                           |
| cos_sink_rest     | cos(ṽ_0^h, m_i^h) (queries that see the sink and another key; NaN when there are none) |
| divergence        | ½ Σ_j abs(α_ij − c_ij), how differently attention and contributions spread the row   |
| negative_share    | Σ_j max(−c_ij, 0) / Σ_j abs(c_ij), the share of the row's contribution mass that is negative |
| output_norm       | ‖o_i^h‖                                                                               |

sink_attention, sink_contribution, divergence and output_norm are those of
:func:`cwviz.analyses.tables.head_summary`; cos_sink_rest that of :func:`cwviz.analyses.sinks.sink_table`.

Pooled (:func:`pool`): each prompt counts once (the mean of its per-prompt values, not of all queries
together, so a long prompt does not outweigh short ones), with a percentile bootstrap interval over prompts
(:data:`BOOTSTRAP` resamples, seeded). Results are a folder (:func:`save`, :func:`load`): the per-prompt table,
the pooled table, the prompts and a manifest, so the maps are reloaded without a forward pass.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..core.analysis import Analysis, analyze
from ..core.errors import CwvizError, InputError
from ..core.models import Bundle
from ..core.progress import Progress, counted, phase
from ..core.texts import iter_jsonl, write_text_atomic
from .bootstrap import bootstrap_interval
from .schema import ATLAS_METRICS
from .sinks import DEFAULT_SINK, head_space, sink_norms

#: Bootstrap resamples of the prompts, the interval's coverage and the generator's seed unless given.
BOOTSTRAP = 1000
CONFIDENCE = 0.95
SEED = 0
#: Files of a results folder.
FILES = {"per_prompt": "per_prompt.csv", "pooled": "pooled.csv", "prompts": "prompts.jsonl", "manifest": "atlas.json"}
SCHEMA = "cwviz.atlas"
VERSION = 1


def prompt_stats(analysis: Analysis, progress: Progress | None = None) -> pd.DataFrame:
    """One row per (layer, head) of one prompt: the columns of :data:`~cwviz.analyses.schema.ATLAS_METRICS`
    (module docstring), from row blocks reduced as they go. ``progress(done, layers)``."""
    heads, t = analysis.num_heads, analysis.num_tokens
    first = 1 if t > 1 else 0
    count = t - first
    out: dict[str, list] = {"layer": [], "head": [], **{name: [] for name in ATLAS_METRICS}}
    for layer in counted(range(analysis.num_layers), analysis.num_layers, progress):
        sums = {name: torch.zeros(heads, dtype=torch.float64) for name in ATLAS_METRICS}
        cos_count = torch.zeros(heads, dtype=torch.float64)
        record = analysis.records[layer]
        with torch.inference_mode():
            value, grams = head_space(analysis, layer)  # (H, T, d_head), (H, d_head, d_head)
            for start, stop, m in analysis.row_blocks(layer, first, kinds=("intra",)):  # [head, block, keys] at a time
                alpha, c = m.attention, m.contribution("intra")
                sums["sink_attention"] += alpha[:, :, DEFAULT_SINK].sum(-1).double().cpu()
                sums["sink_contribution"] += c[:, :, DEFAULT_SINK].sum(-1).double().cpu()
                sums["divergence"] += 0.5 * (alpha - c).abs().sum(-1).sum(-1).double().cpu()
                mass = c.abs().sum(-1)  # (H, rows)
                negative = (-c).clamp_min(0).sum(-1) / mass.clamp_min(1e-30)
                sums["negative_share"] += torch.where(mass > 0, negative, 0).sum(-1).double().cpu()
                sums["output_norm"] += m.head_output_norm.sum(-1).double().cpu()
                split = sink_norms(alpha, value, grams, DEFAULT_SINK, record.key_mask(start, stop))
                # Only the queries that see the sink, as in the sinks table (a sliding window moves past it).
                cos = torch.where(split.sees_sink.to(alpha.device)[None, :], split.cos_sink_rest, torch.nan).double().cpu()
                sums["cos_sink_rest"] += torch.nan_to_num(cos, nan=0.0).sum(-1)
                cos_count += (~cos.isnan()).sum(-1)
        out["layer"] += [layer] * heads
        out["head"] += list(range(heads))
        for name in ATLAS_METRICS:
            if name == "cos_sink_rest":
                values = torch.where(cos_count > 0, sums[name] / cos_count.clamp_min(1), torch.nan)
            else:
                values = sums[name] / count
            out[name] += values.tolist()
    return pd.DataFrame(out)


def iter_prompt_stats(bundle: Bundle, texts: Sequence[str], progress: Progress | None = None, start: int = 0) -> Iterator[pd.DataFrame]:
    """:func:`prompt_stats` of each text in turn (one forward pass each), with a ``prompt`` column (its index,
    counted from ``start``: a sweep runs one prompt of its data at a time) and ``tokens``; ``progress(done, total)``
    counts layer steps over all prompts (a pass and a reduction a layer). A prompt that cannot be analysed raises
    its error with "prompt k: " in front."""
    layers = bundle.info.layers
    total = 2 * layers * len(texts)
    for index, text in enumerate(texts):
        offset = 2 * layers * index
        try:
            analysis = analyze(bundle, text, progress=phase(progress, offset, total))
        except CwvizError as err:
            raise type(err)(f"prompt {start + index + 1}: {err}") from None
        frame = prompt_stats(analysis, progress=phase(progress, offset + layers, total))
        frame.insert(0, "tokens", analysis.num_tokens)
        frame.insert(0, "prompt", start + index)
        yield frame


def pool(per_prompt: pd.DataFrame, bootstrap: int = BOOTSTRAP, confidence: float = CONFIDENCE, seed: int = SEED) -> pd.DataFrame:
    """One row per (layer, head): for each metric its mean over prompts (``<metric>``) and a percentile
    bootstrap interval (``<metric>_low``, ``<metric>_high``): prompts resampled with replacement ``bootstrap``
    times (numpy's generator seeded with ``seed``); ``prompts`` counts them. NaN values (cos_sink_rest of a
    one-token prompt) are left out of the means."""
    if per_prompt.empty:
        raise InputError("no prompt was analysed; nothing to pool")
    if not 0 < confidence < 1:
        raise InputError(f"the confidence must lie between 0 and 1, not {confidence}")
    frame = per_prompt.sort_values(["prompt", "layer", "head"], kind="stable")
    prompts = frame["prompt"].unique()
    keys = frame[frame["prompt"] == prompts[0]][["layer", "head"]].reset_index(drop=True)
    out = keys.copy()
    for name in ATLAS_METRICS:
        values = frame[name].to_numpy(dtype=np.float64).reshape(len(prompts), len(keys))  # (prompt, layer x head)
        with warnings.catch_warnings():  # "Mean of empty slice": a head whose metric is NaN in every prompt stays NaN
            warnings.simplefilter("ignore", category=RuntimeWarning)
            out[name] = np.nanmean(values, axis=0)
        # Each metric draws the same resamples (one seed), as the intervals always have.
        out[f"{name}_low"], out[f"{name}_high"] = bootstrap_interval(values, max(int(bootstrap), 1), confidence, seed, omit_nan=True)
    out["prompts"] = len(prompts)
    return out


def strongest(metric: str) -> str:
    """``"high"`` or ``"low"``: which end of ``metric`` shows the behaviour most strongly (cos_sink_rest: the
    most negative, the sink most anti-aligned; the others: the largest)."""
    if metric not in ATLAS_METRICS:
        raise InputError(f"metric must be one of {', '.join(ATLAS_METRICS)}, not {metric!r}")
    return "low" if metric == "cos_sink_rest" else "high"


@dataclass(frozen=True)
class Atlas:
    """Pooled statistics of every head over prompts, and what they came from."""

    per_prompt: pd.DataFrame  # prompt, tokens, layer, head, the metrics
    pooled: pd.DataFrame  # :func:`pool`
    prompts: tuple[str, ...]
    manifest: dict = field(default_factory=dict)  # model, sink, bootstrap, confidence, seed, schema, version

    def top_prompts(self, layer: int, head: int, metric: str, k: int = 10) -> pd.DataFrame:
        """The ``k`` prompts where (layer, head) shows ``metric`` most strongly (:func:`strongest`), with their
        text: columns rank, prompt, tokens, value, text."""
        end = strongest(metric)
        rows = self.per_prompt[(self.per_prompt["layer"] == layer) & (self.per_prompt["head"] == head)].dropna(subset=[metric])
        if rows.empty:
            raise InputError(f"layer {layer}, head {head} is not in these results")
        rows = rows.sort_values(metric, ascending=end == "low", kind="stable").head(k)
        return pd.DataFrame(
            {
                "rank": np.arange(1, len(rows) + 1),
                "prompt": rows["prompt"].to_numpy(),
                "tokens": rows["tokens"].to_numpy(),
                "value": rows[metric].to_numpy(),
                "text": [self.prompts[int(p)] for p in rows["prompt"]],
            }
        )


def build(
    per_prompt: pd.DataFrame,
    prompts: Sequence[str],
    model: str,
    bootstrap: int = BOOTSTRAP,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> Atlas:
    """An :class:`Atlas` from per-prompt tables (:func:`iter_prompt_stats`, concatenated)."""
    manifest = {
        "schema": SCHEMA,
        "version": VERSION,
        "model": model,
        "sink": DEFAULT_SINK,
        "bootstrap": int(bootstrap),
        "confidence": float(confidence),
        "seed": int(seed),
        "prompts": len(prompts),
    }
    return Atlas(
        per_prompt=per_prompt.reset_index(drop=True),
        pooled=pool(per_prompt, bootstrap, confidence, seed),
        prompts=tuple(prompts),
        manifest=manifest,
    )


def run(
    bundle: Bundle,
    texts: Sequence[str],
    bootstrap: int = BOOTSTRAP,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
    progress: Progress | None = None,
) -> Atlas:
    """:func:`iter_prompt_stats` over ``texts`` (a list of prompts) pooled by :func:`build`."""
    if isinstance(texts, str):
        raise InputError("give a list of prompts, not one string (atlas.run(bundle, [text]) for a single prompt)")
    if not texts:
        raise InputError("no prompts to pool; give a JSONL file with at least one prompt")
    frames = list(iter_prompt_stats(bundle, texts, progress))
    return build(pd.concat(frames, ignore_index=True), texts, bundle.info.id, bootstrap, confidence, seed)


def save(atlas: Atlas, folder: str | Path) -> Path:
    """Write ``atlas`` into ``folder`` (created): :data:`FILES`, each replaced whole
    (:func:`~cwviz.core.texts.write_text_atomic`). InputError when it cannot be written."""
    folder = Path(folder)
    prompts = "".join(json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in atlas.prompts)
    files = {
        "per_prompt": atlas.per_prompt.to_csv(index=False),
        "pooled": atlas.pooled.to_csv(index=False),
        "prompts": prompts,
        "manifest": json.dumps(atlas.manifest, indent=2),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_text_atomic(folder / FILES[name], text)
    except OSError as err:
        raise InputError(f"cannot write the atlas into {str(folder)!r}: {err.strerror or err}; choose a folder you can write to") from None
    return folder


def load(folder: str | Path) -> Atlas:
    """The :class:`Atlas` that :func:`save` wrote into ``folder``, without a forward pass. InputError naming
    what is missing or malformed."""
    folder = Path(folder)
    missing = [name for name in FILES.values() if not (folder / name).is_file()]
    if missing:
        raise InputError(f"{str(folder)!r} holds no atlas results (missing {', '.join(missing)}); run `cwviz atlas --out {folder}` first")
    try:
        manifest = json.loads((folder / FILES["manifest"]).read_text(encoding="utf-8"))
        if manifest.get("schema") != SCHEMA:
            raise ValueError(f"schema {manifest.get('schema')!r}")
        per_prompt = pd.read_csv(folder / FILES["per_prompt"])
        pooled = pd.read_csv(folder / FILES["pooled"])
        prompts = tuple(record["text"] for _, record in iter_jsonl(folder / FILES["prompts"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, pd.errors.ParserError, InputError) as err:
        raise InputError(f"{str(folder)!r} holds malformed atlas results ({err}); write them again with `cwviz atlas --out`") from None
    expected = {"layer", "head", *ATLAS_METRICS}
    if not expected <= set(per_prompt.columns) or not expected <= set(pooled.columns) or len(prompts) != manifest.get("prompts"):
        raise InputError(f"{str(folder)!r} holds incomplete atlas results; write them again with `cwviz atlas --out`")
    return Atlas(per_prompt=per_prompt, pooled=pooled, prompts=prompts, manifest=manifest)
