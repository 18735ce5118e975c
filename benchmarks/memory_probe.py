"""Child process for one peak-memory figure: ``python -m benchmarks.memory_probe WHAT TOKENS``.

Loads the embedded model, runs WHAT on 8 tokens (weights are memory-mapped: this pages them in), resets the kernel's
peak-RSS mark (``/proc/self/clear_refs``, Linux), runs WHAT once (sdpa | plain | full | naive | dashboard | flow |
effect) and prints JSON with the peak increase in MiB.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB -> MiB
    raise RuntimeError(f"{field} not in /proc/self/status")


def main() -> int:
    what, tokens = sys.argv[1], int(sys.argv[2])
    import transformers

    import cwviz
    from benchmarks.workloads import (
        dashboard_steps,
        effect_of_prompt,
        flow_of_prompt,
        full_analysis,
        long_ids,
        naive_contributions,
        plain_forward,
        sdpa_forward,
    )
    from cwviz.core.util.heap import tune_heap

    transformers.utils.logging.disable_progress_bar()
    tune_heap()  # measured as the dashboard's server and the cwviz command run: with their heap settings
    bundle = cwviz.load_model("embedded", device="cpu")
    ids = long_ids(bundle, tokens)
    fn = {
        "sdpa": sdpa_forward,
        "plain": plain_forward,
        "full": full_analysis,
        "naive": naive_contributions,
        "dashboard": dashboard_steps,
        "flow": flow_of_prompt,
        "effect": effect_of_prompt,
    }[what]
    fn(bundle, ids[:8])  # page in the memory-mapped weights, so that only the run itself is measured
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    result = fn(bundle, ids)
    peak = _status("VmHWM")
    del result
    print(json.dumps({"what": what, "tokens": tokens, "peak_increase_mib": peak - before}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
