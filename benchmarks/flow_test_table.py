"""The Flow page's record of the fair test (docs/METHOD.md section 7.3): each run's means, one table for the page.

    python -m benchmarks.flow_test_table embedded=runs/smollm2 embedded-gemma=runs/gemma3

reads ``DIR/flow_faithfulness_methods.csv`` of each ``MODEL=DIR`` (written by ``cwviz flow-faithfulness``) and writes
``cwviz/app/flow_test.csv`` (``model, intervention, method, statistic, mean, ci_low, ci_high, n``: the columns the
page's sentence reads, :data:`cwviz.app.flow_services.TEST_COLUMNS`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from cwviz.analyses import flow_faithfulness
from cwviz.app.flow_services import TEST_COLUMNS, TEST_RESULTS


def main(argv=None) -> int:
    pairs = [item.split("=", 1) for item in (sys.argv[1:] if argv is None else argv)]
    frames = []
    for model, folder in pairs:
        table = pd.read_csv(Path(folder) / flow_faithfulness.METHODS_CSV_NAME)
        frames.append(table.assign(model=model)[list(TEST_COLUMNS)])
    pd.concat(frames, ignore_index=True).to_csv(TEST_RESULTS, index=False, float_format="%.4g")
    print(f"wrote {TEST_RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
