"""Every default value of cwviz, written once (docs/METHOD.md, "Glossary": defaults).

The core, the analyses, the command line's parsers and the pages all import these names from here, so a default
shown in ``--help``, on a page and used by the library is one value. Torch-free and import-free on purpose: the
parsers show these defaults in ``--help``, which must start in well under a second without torch (a test says so),
and a chart built in a notebook reads them too. A page's text formats the constant; no value is written twice.
"""

from __future__ import annotations

# -- the model (cwviz.load_model, every command's --model/--device/--dtype, the sidebar) ----------------------------
#: The model loaded when none is named: the embedded SmolLM2 (it ships with cwviz, so the default works offline).
MODEL = "embedded"
#: ``auto``: cuda, then mps, then cpu; and bfloat16 on cuda, float32 elsewhere (:mod:`cwviz.core.loading.models`).
DEVICE = "auto"
DTYPE = "auto"

# -- bootstrap intervals (faithfulness, the claims check, the flow's causal test, the atlas) ------------------------
#: Percentile bootstrap intervals over items: their coverage and resamples, and the seed of the generator (and of the
#: random rankings) unless one is given.
CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0

# -- faithfulness (cwviz.analyses.faithfulness, cwviz faithfulness, the Faithfulness page) -------------------------
#: The measures ranked, in the paper's expected order of faithfulness, then the control.
RANKED_MEASURES: tuple[str, ...] = (
    "raw",
    "value_weighted",
    "value_weighted_output_normalized",
    "contribution_inter",
    "contribution_intra",
    "random",
)
#: Removal rates, in percent of each query's keys.
DEFAULT_RATES: tuple[float, ...] = (1.0, 5.0, 10.0, 20.0, 30.0, 50.0)
#: The token cap per example: longer ones are cut.
EXAMPLE_MAX_TOKENS = 256
#: Masked runs per forward pass (``Protocol.batch_size``).
DEFAULT_BATCH_SIZE = 8
#: Random rankings per example (the control, docs/METHOD.md section 3): each seeded by (seed, example, draw).
DEFAULT_DRAWS = 3
#: Examples a sweep reads by default (the CLI's ``--n``).
DEFAULT_EXAMPLES = 20

# -- the claims check (cwviz.analyses.claims, cwviz claims, the Claims page) ---------------------------------------
#: Claim 1's removal rates, in percent.
CLAIMS_RATES: tuple[float, ...] = (10.0, 30.0)
#: The token cap per item, one value for the CLI and the page: a claims run's numbers depend on the cap, so one cap
#: makes the two comparable; 48 (the CLI's) because each item costs about T² per layer and masked run, and a user
#: who wants longer items raises it in either.
CLAIMS_MAX_TOKENS = 48
#: Claim 3: a head is sink-active when its mean sink ratio over the item's queries is at least this (pre-registered,
#: docs/METHOD.md section 5); claim 4's operating point is taken over the same heads.
SINK_ACTIVE = 0.3
#: Claim 3's thresholds, the pre-registered one among them; the others are reported beside it as evidence.
SINK_ACTIVE_THRESHOLDS: tuple[float, ...] = (0.1, SINK_ACTIVE, 0.5, 0.7)

# -- sinks (cwviz.analyses.sinks) ----------------------------------------------------------------------------------
#: The sink unless the user picks one: the first position (docs/METHOD.md section 4).
DEFAULT_SINK = 0
#: λ, the factor on the sink's value in interventions unless given (0 removes its write).
DEFAULT_FACTOR = 0.0

# -- the atlas (cwviz.analyses.atlas, cwviz atlas) -----------------------------------------------------------------
#: Bootstrap resamples of the prompts, the interval's coverage, the generator's seed, heads listed per statistic.
ATLAS_BOOTSTRAP = 1000
ATLAS_CONFIDENCE = CONFIDENCE
ATLAS_SEED = SEED
ATLAS_TOP = 5

# -- compare (cwviz compare) ---------------------------------------------------------------------------------------
#: Heads listed, and log-probability changes printed.
COMPARE_TOP = 10

# -- the flow (cwviz.core.method.flow, cwviz flow, the Flow page) --------------------------------------------------
#: The kept fraction of the route (docs/METHOD.md, "Glossary"): the fraction of the cross-token |weight| on paths into
#: the prediction that the drawn route keeps (:func:`cwviz.analyses.route.route`; the page's setting and the CLI's
#: ``--kept``: one route whoever draws it).
KEPT = 0.2
#: The layer kept fraction: the fraction of each layer's |edge mass| that ``Flow.edges`` (the library's edge table)
#: keeps. Another whole than :data:`KEPT`'s (each layer's edges, not the paths into the prediction), so another value.
LAYER_KEPT = 0.8
#: Edges kept per layer while its row blocks are read (the largest |weight| first), by the share flow and the effect
#: flow.
EDGE_LIMIT = 20_000
#: Listed each way (most supporting and most suppressing): the input tokens and heads of ``cwviz flow``'s report, and
#: each head's vocabulary tokens (most promoted and most suppressed by its write).
FLOW_TOP = 5
#: The attribution method ``cwviz flow`` and the Flow page show (docs/METHOD.md section 7.3 decides it).
FLOW_METHOD = "effect"
#: Its causal test (cwviz.analyses.flow_faithfulness): the token cap per item, knockouts per forward pass (on a CPU,
#: 32 rows a pass ran 64 knockouts five times faster than 8: per-layer overhead) and random rankings per item.
FLOW_MAX_TOKENS = 32
FLOW_BATCH_SIZE = 32
FLOW_DRAWS = 5
