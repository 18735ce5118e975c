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

Pooled (:func:`pool`): each prompt counts once (the mean of its per-prompt values, not of all queries together, so a
long prompt does not outweigh short ones), with a percentile bootstrap interval over prompts
(:data:`~cwviz.core.defaults.ATLAS_BOOTSTRAP` resamples, seeded). Results are a folder (:func:`save`, :func:`load`): the
per-prompt table, the pooled table, the prompts and a manifest, so the maps are reloaded without a forward pass.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..core.defaults import ATLAS_BOOTSTRAP, ATLAS_CONFIDENCE, ATLAS_SEED, DEFAULT_SINK
from ..core.loading.models import Bundle
from ..core.loading.provenance import model_provenance
from ..core.method.analysis import Analysis, analyze
from ..core.util.errors import CwvizError, InputError
from ..core.util.progress import Progress, counted, phase
from ..core.util.texts import iter_jsonl, write_text_atomic
from . import sweep
from .bootstrap import bootstrap_interval
from .codecs.sweeps import ATLAS
from .records import changed_files, file_sums
from .schema import ATLAS_METRICS
from .sinks import head_space, sink_norms

#: The most bootstrap resamples (:func:`check_bootstrap`): far beyond what a 95% interval needs (1,000 fix its ends
#: to about a percent), and the pooled means of the resamples are held at once, resamples x prompts x heads x 8 bytes.
MAX_BOOTSTRAP = 100_000
#: The memory the resamples may take, in bytes (:func:`check_bootstrap`).
BOOTSTRAP_BYTES = 2 * 1024**3
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
                split = sink_norms(alpha, value, grams, DEFAULT_SINK, analysis.key_mask(layer, start, stop))
                # Only the queries that see the sink, as in the sinks table (a sliding window moves past it).
                cos = (
                    torch.where(split.sees_sink.to(alpha.device)[None, :], split.cos_sink_rest, torch.nan)
                    .double()
                    .cpu()
                )
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


def iter_prompt_stats(
    bundle: Bundle, texts: Sequence[str], progress: Progress | None = None, start: int = 0
) -> Iterator[pd.DataFrame]:
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


def check_bootstrap(bootstrap, prompts: int = 1, heads: int = 1, name: str = "bootstrap") -> int:
    """``bootstrap`` (resamples) as an int when it is one from 1 to :data:`MAX_BOOTSTRAP` and the resampled means of
    ``prompts`` prompts x ``heads`` (layer, head) columns fit in :data:`BOOTSTRAP_BYTES`; InputError otherwise.
    Checked before any forward pass (the CLI; :func:`run`) and when pooling."""
    if (
        isinstance(bootstrap, bool)
        or not isinstance(bootstrap, (int, np.integer))
        or not 1 <= bootstrap <= MAX_BOOTSTRAP
    ):
        raise InputError(f"{name} must be a whole number of resamples from 1 to {MAX_BOOTSTRAP:,}, not {bootstrap!r}")
    need = int(bootstrap) * max(prompts, 1) * max(heads, 1) * 8
    if need > BOOTSTRAP_BYTES:
        most = max(1, BOOTSTRAP_BYTES // (max(prompts, 1) * max(heads, 1) * 8))
        raise InputError(
            f"{bootstrap:,} bootstrap resamples of {prompts:,} prompts x {heads:,} heads would take "
            f"{need / 1024**3:,.1f} GiB; give at most {most:,}"
        )
    return int(bootstrap)


def check_confidence(confidence, name: str = "the confidence") -> float:
    """The intervals' coverage when it is a number strictly between 0 and 1; InputError otherwise."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.floating)) or not 0 < confidence < 1:
        raise InputError(f"{name} must lie between 0 and 1, not {confidence!r}")
    return float(confidence)


def check_seed(seed, name: str = "the seed") -> int:
    """The bootstrap's seed when it is a non-negative integer (numpy's generators take no other); InputError otherwise,
    before any forward pass (a run must not end in the bootstrap, its prompts computed and lost)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"{name} must be a non-negative integer, not {seed!r}")
    return int(seed)


def pool(
    per_prompt: pd.DataFrame,
    bootstrap: int = ATLAS_BOOTSTRAP,
    confidence: float = ATLAS_CONFIDENCE,
    seed: int = ATLAS_SEED,
) -> pd.DataFrame:
    """One row per (layer, head): for each metric its mean over prompts (``<metric>``) and a percentile
    bootstrap interval (``<metric>_low``, ``<metric>_high``): prompts resampled with replacement ``bootstrap``
    times (numpy's generator seeded with ``seed``); ``prompts`` counts them. NaN values (cos_sink_rest of a
    one-token prompt) are left out of the means."""
    if per_prompt.empty:
        raise InputError("no prompt was analysed; nothing to pool")
    check_confidence(confidence)
    seed = check_seed(seed)
    frame = per_prompt.sort_values(["prompt", "layer", "head"], kind="stable")
    prompts = frame["prompt"].unique()
    keys = frame[frame["prompt"] == prompts[0]][["layer", "head"]].reset_index(drop=True)
    bootstrap = check_bootstrap(bootstrap, len(prompts), len(keys))
    out = keys.copy()
    for name in ATLAS_METRICS:
        values = frame[name].to_numpy(dtype=np.float64).reshape(len(prompts), len(keys))  # (prompt, layer x head)
        with warnings.catch_warnings():  # "Mean of empty slice": a head whose metric is NaN in every prompt stays NaN
            warnings.simplefilter("ignore", category=RuntimeWarning)
            out[name] = np.nanmean(values, axis=0)
        # Each metric draws the same resamples (one seed), as the intervals always have.
        out[f"{name}_low"], out[f"{name}_high"] = bootstrap_interval(values, bootstrap, confidence, seed, omit_nan=True)
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
        rows = self.per_prompt[(self.per_prompt["layer"] == layer) & (self.per_prompt["head"] == head)].dropna(
            subset=[metric]
        )
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
    bootstrap: int = ATLAS_BOOTSTRAP,
    confidence: float = ATLAS_CONFIDENCE,
    seed: int = ATLAS_SEED,
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
    bootstrap: int = ATLAS_BOOTSTRAP,
    confidence: float = ATLAS_CONFIDENCE,
    seed: int = ATLAS_SEED,
    progress: Progress | None = None,
    store: MutableMapping[int, dict] | None = None,
) -> Atlas:
    """The atlas of ``texts`` (a list of prompts): each prompt's :func:`prompt_stats` through the one runner
    (:func:`cwviz.analyses.sweep.run`, in memory), pooled by :func:`build`; ``progress(done, total)`` counts layer
    steps over all prompts (a pass and a reduction a layer). ``store`` (example -> record) keeps each finished prompt:
    a call stopped half-way leaves them there, and a call with the same store and prompts runs only the rest."""
    if isinstance(texts, str):
        raise InputError("give a list of prompts, not one string (atlas.run(bundle, [text]) for a single prompt)")
    if not texts:
        raise InputError("no prompts to pool; give a JSONL file with at least one prompt")
    check_bootstrap(bootstrap, len(texts), bundle.info.layers * bundle.info.heads)  # before the forward passes
    check_confidence(confidence)
    check_seed(seed)
    steps = 2 * bundle.info.layers

    def compute(index: int) -> dict:
        (frame,) = iter_prompt_stats(
            bundle, [texts[index]], phase(progress, steps * index, steps * len(texts)), start=index
        )
        return ATLAS.encode(frame)

    outcome = sweep.run(
        sweep.Sweep(ATLAS, ATLAS.settings(DEFAULT_SINK, model_provenance(bundle)), texts), compute, store=store
    )
    if outcome.interrupted:
        raise KeyboardInterrupt  # a caller's Ctrl-C: a part of the prompts is no atlas of them
    return build(ATLAS.decode(outcome.records), texts, bundle.info.id, bootstrap, confidence, seed)


def save(atlas: Atlas, folder: str | Path) -> Path:
    """Write ``atlas`` into ``folder`` (created): :data:`FILES`, each replaced whole
    (:func:`~cwviz.core.util.texts.write_text_atomic`). InputError when it cannot be written."""
    folder = Path(folder)
    prompts = "".join(json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in atlas.prompts)
    files = {
        "per_prompt": atlas.per_prompt.to_csv(index=False),
        "pooled": atlas.pooled.to_csv(index=False),
        "prompts": prompts,
    }
    # The manifest names each file's sha256: load refuses a file edited, cut or copied from another run.
    sums = file_sums({FILES[name]: text for name, text in files.items()})
    files["manifest"] = json.dumps(atlas.manifest | {"files": sums}, indent=2)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_text_atomic(folder / FILES[name], text)
    except OSError as err:
        raise InputError(
            f"cannot write the atlas into {str(folder)!r}: {err.strerror or err}; choose a folder you can write to"
        ) from None
    return folder


def load(folder: str | Path) -> Atlas:
    """The :class:`Atlas` that :func:`save` wrote into ``folder``, without a forward pass, checked whole
    (:func:`check_saved`): InputError naming what is missing, cut, edited or from another run, and how to write it
    again; never a part of the results."""
    folder = Path(folder)
    missing = [name for name in FILES.values() if not (folder / name).is_file()]
    if missing:
        raise InputError(
            f"{str(folder)!r} holds no atlas results (missing {', '.join(missing)}); run `cwviz atlas "
            f"--out {folder}` first"
        )
    again = "write them again with `cwviz atlas --out` (or `--results DIR --resume`)"
    try:
        for name in ("per_prompt", "pooled", "prompts"):  # to_csv and save end every file with a newline
            if not (folder / FILES[name]).read_bytes().endswith(b"\n"):
                raise ValueError(f"{FILES[name]} ends mid-line: it was cut off")
        manifest = json.loads((folder / FILES["manifest"]).read_text(encoding="utf-8"))
        per_prompt = pd.read_csv(folder / FILES["per_prompt"])
        pooled = pd.read_csv(folder / FILES["pooled"])
        prompts = tuple(_prompt(record) for _, record in iter_jsonl(folder / FILES["prompts"]))
        check_saved(manifest, per_prompt, pooled, prompts)  # what is wrong, named; then any other change
        check_sums(folder, manifest)
    except (
        ValueError,
        KeyError,
        TypeError,
        UnicodeDecodeError,
        pd.errors.ParserError,
        pd.errors.EmptyDataError,
        InputError,
    ) as err:
        raise InputError(f"{str(folder)!r} holds malformed atlas results ({err}); {again}") from None
    return Atlas(
        per_prompt=per_prompt,
        pooled=pooled,
        prompts=prompts,
        manifest={k: v for k, v in manifest.items() if k != "files"},
    )


def check_sums(folder: Path, manifest: object) -> None:
    """ValueError when a file differs from the sha256 the manifest names for it (a folder saved before the
    manifest named them is checked by its contents alone: :func:`check_saved`)."""
    if isinstance(manifest, dict) and "files" in manifest:
        changed = changed_files(folder, manifest["files"])
        if changed:
            raise ValueError(
                f"{', '.join(changed)} is not what cwviz wrote with {FILES['manifest']} (edited, cut, or "
                "from another run)"
            )


def _prompt(record: object) -> str:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise ValueError(f'{FILES["prompts"]} holds a line that is not {{"text": ...}}')
    return record["text"]


def check_saved(manifest: object, per_prompt: pd.DataFrame, pooled: pd.DataFrame, prompts: tuple[str, ...]) -> None:
    """ValueError naming the first disagreement unless the files of a saved atlas are whole and of one run: the
    manifest as :func:`build` writes it; per_prompt.csv every (layer, head) of each of its prompts; pooled.csv one
    row per (layer, head) with each metric, its interval and, as its means, those of per_prompt.csv."""
    if not isinstance(manifest, dict):
        raise ValueError(f"{FILES['manifest']} is a JSON {type(manifest).__name__}, not the object cwviz writes")
    if manifest.get("schema") != SCHEMA or manifest.get("version") != VERSION:
        raise ValueError(f"{FILES['manifest']} is not a {SCHEMA} manifest of version {VERSION}")
    try:
        check_bootstrap(manifest.get("bootstrap"))
        check_confidence(manifest.get("confidence"))
    except InputError as err:
        raise ValueError(f"{FILES['manifest']}: {err}") from None
    count = manifest.get("prompts")
    if isinstance(count, bool) or not isinstance(count, int) or count != len(prompts) or count < 1:
        raise ValueError(f"{FILES['manifest']} counts {count!r} prompts; {FILES['prompts']} holds {len(prompts)}")
    if (
        not isinstance(manifest.get("seed"), int)
        or isinstance(manifest.get("seed"), bool)
        or not isinstance(manifest.get("model"), str)
    ):
        raise ValueError(f"{FILES['manifest']}: 'seed' must be an integer and 'model' text")
    intervals = [f"{m}_{end}" for m in ATLAS_METRICS for end in ("low", "high")]
    for name, table, columns in (
        (FILES["per_prompt"], per_prompt, ["prompt", "tokens", "layer", "head", *ATLAS_METRICS]),
        (FILES["pooled"], pooled, ["layer", "head", *ATLAS_METRICS, *intervals, "prompts"]),
    ):
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise ValueError(f"{name} lacks the column(s) {', '.join(missing)}")
        text = [c for c in columns if not pd.api.types.is_numeric_dtype(table[c])]
        if text:
            raise ValueError(f"{name}: {', '.join(text)} hold(s) text, not numbers")
        whole = [c for c in columns if c in ("prompt", "tokens", "layer", "head", "prompts")]
        if table[whole].isna().any().any() or (table[whole] % 1 != 0).any().any() or (table[whole] < 0).any().any():
            raise ValueError(f"{name}: {', '.join(whole)} must be whole numbers in every row")
    grid = pooled[["layer", "head"]]
    per = per_prompt.sort_values(["prompt", "layer", "head"], kind="stable")
    cells = len(grid)
    if set(per["prompt"]) != set(range(count)) or len(per) != count * cells or grid.duplicated().any() or cells == 0:
        raise ValueError(
            f"{FILES['per_prompt']} and {FILES['pooled']} do not hold every (layer, head) of all {count} prompts"
        )
    keys = grid.sort_values(["layer", "head"]).to_numpy()
    if not (per[["layer", "head"]].to_numpy().reshape(count, cells, 2) == keys[None]).all() or set(
        pooled["prompts"]
    ) != {count}:
        raise ValueError(
            f"{FILES['per_prompt']} and {FILES['pooled']} hold other heads or prompt counts (files of other runs)"
        )
    order = pooled.sort_values(["layer", "head"], kind="stable")
    for metric in ATLAS_METRICS:
        values = per[metric].to_numpy(np.float64).reshape(count, cells)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            means = np.nanmean(values, axis=0)
        if not np.allclose(means, order[metric].to_numpy(np.float64), rtol=1e-9, atol=0, equal_nan=True):
            raise ValueError(
                f"{FILES['pooled']}'s {metric} is not the mean of {FILES['per_prompt']}'s (edited, or of another run)"
            )
