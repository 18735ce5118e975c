"""``cwviz report --results DIR --out report.html``: one self-contained, offline HTML report of a results folder.

It reads what ``cwviz faithfulness --results DIR`` and ``cwviz sinks --results DIR`` wrote there (the manifest,
the per-example records, ``sinks/``), recomputes the summary from the records, and writes the curves, tables,
order check, accuracy (multiple-choice tasks), sinks and the manifest with how to rerun the run
(:mod:`cwviz.charts.report`). Nothing is run on a model.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import pandas as pd

from ..analyses import claims, faithfulness_summary, flow_faithfulness, records
from ..analyses.codecs.checks import CLAIMS
from ..analyses.codecs.sweeps import FAITHFULNESS, SINKS
from ..charts import report
from ..core.util.errors import InputError
from . import outputs
from .sinks import RESULTS_FOLDER


def faithfulness_sections(folder: Path) -> list:
    """The run's manifest, the faithfulness curves and, for a multiple-choice task, accuracy; [] without records."""
    if not any(folder.glob(records.RECORD_GLOB)):
        return []
    made = records.read_records(folder, FAITHFULNESS)  # checked: one run's records, in range, whole (and the manifest)
    table = FAITHFULNESS.decode(made)
    manifest = records.read_manifest(folder, FAITHFULNESS) or {}
    total = records.manifest_items(manifest)
    measured = sum(1 for record in made if not record["skipped"])
    recorded = (
        f"{len(made)} example(s): {measured} measured (the tables' n), {len(made) - measured} skipped (fewer than two "
        "tokens)"
    )
    if total is not None and len(made) < total:  # an unfinished run: the report says so (and how to finish it)
        print(
            f"note: {folder} holds {len(made)} of the run's {total} examples; add --resume to the run's command to "
            "finish it"
        )
    if not len(table):
        raise InputError(f"the records in {folder} hold no finished example; run the sweep (with --resume) first")
    summary = faithfulness_summary.summarize(table, seed=manifest.get("seed", 0))
    areas = faithfulness_summary.curve_areas(summary)
    sections = [report.manifest_section(manifest, recorded=recorded)] if manifest else []
    by_area = faithfulness_summary.order_check(areas)
    by_rate = faithfulness_summary.order_check(summary, value="delta_ppl")
    sections.append(report.faithfulness_section(summary, areas, by_area, by_rate))
    if "delta_accuracy" in summary:
        sections.append(report.accuracy_section(summary))
    return sections


def sinks_section(folder: Path):
    """The sinks tables of ``DIR/sinks`` (``cwviz sinks --results DIR``), or None."""
    where = folder / RESULTS_FOLDER
    if not (where / "layers.csv").is_file():
        return None
    # The tables come from these records: a folder whose records mix runs or are damaged is refused.
    made = records.read_records(where, SINKS) if any(where.glob(records.RECORD_GLOB)) else []
    manifest = records.read_manifest(where, SINKS) or {}
    changed = records.changed_files(where, manifest["files"]) if "files" in manifest else []
    if changed:
        raise InputError(
            f"{', '.join(changed)} in {where} is not what cwviz sinks wrote (edited, cut, or from another run); "
            f"rerun cwviz sinks --results {folder} --resume"
        )
    layers = sinks_table(where / "layers.csv", LAYER_COLUMNS, folder)
    heads = sinks_table(where / "heads.csv", HEAD_COLUMNS, folder) if (where / "heads.csv").is_file() else None
    made_layers = sorted(set(made[0]["table"]["layer"])) if made else sorted(set(layers["layer"]))
    count = max(made[0]["table"]["head"]) + 1 if made else None
    for path, table in ((where / "layers.csv", layers), (where / "heads.csv", heads)):
        layers_ok = table is None or sorted(set(table["layer"])) == made_layers
        per_layer = [] if table is None or "head" not in table else table.groupby("layer").size().tolist()
        heads_ok = not per_layer or len(set(per_layer)) == 1 and (count is None or per_layer[0] == count)
        if (
            not layers_ok
            or not heads_ok
            or len(layers) != len(made_layers)
            or made_layers != list(range(len(made_layers)))
        ):
            raise InputError(
                f"{path} does not hold the {len(made_layers)} layers of the records beside it (or not every head of "
                f"each: cut, or from another run); rerun cwviz sinks --results {folder} --resume"
            )
    return report.sinks_section(manifest, layers, heads)


#: The columns the report reads from ``sinks/layers.csv`` and ``sinks/heads.csv`` (numbers, all of them).
LAYER_COLUMNS = ("layer", "sink_attention_share", "sink_contribution_share")
HEAD_COLUMNS = ("layer", "head", "cos_sink_rest")


def sinks_table(path: Path, columns: tuple[str, ...], folder: Path) -> pd.DataFrame:
    """A sinks CSV of the results folder, or InputError naming it and how to write it again when it is empty,
    not CSV, or lacks one of ``columns`` (or holds text in one)."""
    rerun = f"rerun cwviz sinks --results {folder} --resume"
    data = path.read_bytes()
    if data.strip() and not data.endswith(b"\n"):  # an empty file is named below
        raise InputError(f"{path} is not a whole cwviz sinks table (it ends mid-line: cut off); {rerun}")
    try:
        table = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as err:
        reason = "it is empty" if isinstance(err, pd.errors.EmptyDataError) else "it is not CSV"
        raise InputError(f"{path} is not a cwviz sinks table ({reason}); {rerun}") from None
    missing = [c for c in columns if c not in table]
    if missing:
        raise InputError(f"{path} is not a cwviz sinks table (missing {', '.join(missing)}); {rerun}")
    text = [c for c in table.columns if not pd.api.types.is_numeric_dtype(table[c])]  # every column is a number
    if text:
        raise InputError(f"{path} is not a cwviz sinks table ({', '.join(text)} hold(s) text, not numbers); {rerun}")
    keys = [c for c in ("layer", "head") if c in columns]
    if (
        table[keys].isna().any().any()
        or (table[keys] < 0).any().any()
        or (table[keys] % 1 != 0).any().any()
        or table.duplicated(keys).any()
    ):
        raise InputError(
            f"{path} is not a cwviz sinks table (its {' and '.join(keys)} column(s) are not distinct indices); {rerun}"
        )
    return table


def claims_section(folder: Path):
    """The claims of ``DIR/claims`` (``cwviz claims --results DIR``), recomputed from its records, or None."""
    where = folder / claims.RECORDS_FOLDER
    if not where.is_dir() or not any(where.glob(records.RECORD_GLOB)):
        return None
    manifest = records.read_manifest(where, CLAIMS) or {}
    table = claims.claims_table(records.read_records(where, CLAIMS), seed=int(manifest.get("seed", 0)))
    if not len(table):
        raise InputError(f"the records in {where} hold no finished item; run cwviz claims (with --resume) first")
    return report.claims_section(manifest, claims.overview(table), table)


#: Where a flow-faithfulness run's results are read instead of in a report.
FLOW_RESULTS = (
    f"its verdicts are in {flow_faithfulness.CSV_NAME} and each method's means in {flow_faithfulness.METHODS_CSV_NAME} "
    "there, and the command prints them"
)


def run(args: argparse.Namespace) -> int:
    folder: Path = args.results
    if not folder.is_dir():
        raise InputError(f"no results folder at {folder}; give the folder a sweep wrote with --results")
    outputs.check_file(args.out, "--out", "report.html")
    sections = faithfulness_sections(folder)
    sinks = sinks_section(folder)
    if sinks is not None:
        sections.append(sinks)
    claims = claims_section(folder)
    if claims is not None:
        sections.append(claims)
    flow_results = (folder / flow_faithfulness.RECORDS_FOLDER).is_dir()
    if not sections:
        if flow_results:
            raise InputError(
                f"{folder} holds the results of `cwviz flow-faithfulness`, which the report does not "
                f"cover: {FLOW_RESULTS}"
            )
        raise InputError(
            f"{folder} holds no results: run `cwviz faithfulness --results {folder}` or `cwviz sinks --results "
            f"{folder}` first"
        )
    if flow_results:
        print(f"note: the report leaves out the `cwviz flow-faithfulness` results in {folder}: {FLOW_RESULTS}")
    generated = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    text = report.page(sections, title=args.title, generated=generated)
    outputs.write(args.out, text)
    print(f"wrote {args.out} ({len(text) / 1024:,.0f} KiB; sections: {', '.join(s.title for s in sections)})")
    return 0
