"""The supplementary run of docs/METHOD.md section 7.3: registry members that were not ready when the main runs started,
scored on the same items against the effects the main run measured (ρ, signed ρ and top-3 sign agreement, paired with
the effect flow's; no new knockouts, so no AOPC).

    python -m benchmarks.flow_supplement --results runs/smollm2 --model embedded --methods alti_logit

Reads ``DIR/flow_faithfulness/`` (the main run's records: their cut, target and foil), prints a Markdown table and
writes ``DIR/flow_supplement.csv`` (one row per method, intervention and statistic, with the paired comparison)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

import cwviz
from cwviz.analyses import flow_faithfulness as test
from cwviz.analyses import flow_verdicts
from cwviz.analyses.claims import judge, mean_interval
from cwviz.analyses.codecs.checks import FLOW_FAITHFULNESS
from cwviz.analyses.faithfulness import example_ids
from cwviz.analyses.records import read_records
from cwviz.core.method import attribution
from cwviz.core.util.texts import read_texts

STATISTICS = (flow_verdicts.PRIMARY, "rho_signed", "sign_agreement")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--methods", default="alti_logit")
    args = parser.parse_args(argv)
    records = [r for r in read_records(args.results / test.RECORDS_FOLDER, FLOW_FAITHFULNESS) if not r["skipped"]]
    manifest = json.loads((args.results / test.RECORDS_FOLDER / "manifest.json").read_text())
    settings = manifest["settings"]
    texts = read_texts(Path(manifest["data"]["jsonl"]), n=manifest["data"]["examples"], field=None)
    bundle = cwviz.load_model(args.model, device="cpu")
    methods = [attribution.check_method(name) for name in args.methods.split(",")]
    rows = []
    for record in records:
        ids = example_ids(bundle, texts[record["example"]], settings["max_tokens"])
        analysis = cwviz.analyze(bundle, input_ids=ids)
        p = len(ids) - 1
        asked = attribution.Request(analysis, p, record["target"], record["foil"])
        scores = {m.name: attribution.run(m, asked).scores[:p] for m in methods}
        scores["effect"] = np.asarray(record["scores"]["effect"])
        for intervention in test.INTERVENTIONS:
            effects = np.asarray(record["effects"][intervention])
            for name, values in scores.items():
                signed = name == "effect" or attribution.METHODS[name].signed
                stats = flow_verdicts.per_item(values, effects, signed)
                rows.append({"example": record["example"], "intervention": intervention, "method": name, **stats})
    items = pd.DataFrame(rows)
    out = []
    for intervention in test.INTERVENTIONS:
        for m in methods:
            for statistic in STATISTICS:
                wide = items[items.intervention == intervention].pivot(
                    index="example", columns="method", values=statistic
                )
                own = wide[m.name].dropna()
                diff = (wide["effect"] - wide[m.name]).dropna()
                if not len(own) or not len(diff):
                    continue
                (mean,), (low,), (high,), n = mean_interval(own.to_numpy()[:, None], 0)
                (d,), (dl,), (dh,), dn = mean_interval(diff.to_numpy()[:, None], 0)
                out.append(
                    {
                        "intervention": intervention,
                        "method": m.name,
                        "statistic": statistic,
                        "mean": mean,
                        "ci_low": low,
                        "ci_high": high,
                        "n": n,
                        "effect_minus_method": d,
                        "diff_low": dl,
                        "diff_high": dh,
                        "verdict_effect_vs_method": judge(dl, dh) if dn >= 5 else "unresolved",
                    }
                )
    table = pd.DataFrame(out)
    table.to_csv(args.results / "flow_supplement.csv", index=False, float_format="%.6g")
    print("| " + " | ".join(table.columns) + " |")
    print("|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        print("| " + " | ".join(f"{v:+.3f}" if isinstance(v, float) else str(v) for v in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
