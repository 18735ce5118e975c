"""The dashboard's runs over many items (the Faithfulness and Claims pages), through the one runner
(:func:`cwviz.analyses.sweep.run`) in memory, with a progress bar, the shared server's slot and the records kept.

A run's finished records are kept per run (record type, fingerprint, texts) in this server process (:func:`store`,
``st.cache_resource``; the Atlas page's too): a page stopped mid-run (its Stop button, or any widget, interrupts the
script between two Streamlit calls) keeps what is finished, and Run with the same settings resumes from it. The records
are the CLI's (the same settings, fingerprint, envelope and payload), so they are shared between sessions as any cached
result is. A page keeps only what it last asked for; the records, the progress and the order are the runner's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import streamlit as st

from ..analyses import claim_runs, faithfulness, records, sweep, tasks
from ..analyses.codecs.checks import CLAIMS
from ..analyses.codecs.sweeps import FAITHFULNESS
from ..core.loading.provenance import model_provenance
from . import hosting, services


@st.cache_resource(show_spinner=False, max_entries=16)
def _store(record_type: str, key: str, texts: str) -> dict[int, dict]:
    return {}


def store(record_type: str, key: str, texts: Sequence[str]) -> dict[int, dict]:
    """The records made so far in this server process (example -> record) of the run of ``record_type`` on ``texts``
    that ``key`` names (its fingerprint, or the model that decides it), to resume from."""
    return _store(record_type, key, records.fingerprint({"texts": list(texts)}))


def kept(plan: sweep.Sweep) -> dict[int, dict]:
    """The records of ``plan``'s run made so far (:func:`store`)."""
    return store(plan.record_type.name, plan.key, plan.texts)


def finished(plan: sweep.Sweep) -> list[dict]:
    """The records of ``plan``'s run made so far, by example."""
    made = kept(plan)
    return [made[i] for i in sorted(made)]


def run(plan: sweep.Sweep, compute: Callable[[int], dict], label: str, unit: str) -> sweep.Outcome:
    """``plan``'s unfinished items (:func:`cwviz.analyses.sweep.run`, in memory), each in the shared server's slot
    (:func:`cwviz.app.hosting.analysis_slot`), a bar drawn at once ("label: item 2 of 5, about 3 min left",
    :func:`cwviz.app.services.item_bar`) while they run."""
    policy = hosting.policy_from_env()
    store = kept(plan)

    def slotted(index: int) -> dict:
        with hosting.analysis_slot(policy):  # a shared server runs at most CWVIZ_MAX_CONCURRENT at once
            return compute(index)

    with services.item_bar(label, len(plan.texts), len(store), unit) as progress:
        return sweep.run(plan, slotted, progress=progress, store=store)


@dataclass(frozen=True)
class Asked:
    """A page's run: the model and what to run it on (the key of its records, with the model's provenance)."""

    model: tuple[str, str, str]  # model, device, dtype
    texts: tuple[str, ...]
    protocol: faithfulness.Protocol


def faithfulness_plan(asked: Asked) -> sweep.Sweep:
    """The Faithfulness page's run of ``asked`` (text examples), as ``cwviz faithfulness`` makes it."""
    bundle = services.get_bundle(*asked.model)
    return sweep.Sweep(FAITHFULNESS, FAITHFULNESS.settings(asked.protocol, model_provenance(bundle)), asked.texts)


def run_faithfulness(asked: Asked) -> sweep.Outcome:
    """:func:`faithfulness_plan`'s unfinished examples, a second bar with the forward passes of the one in progress."""
    bundle = services.get_bundle(*asked.model)
    faithfulness.check_causal(bundle)
    with services.progress_bar("The example in progress", "forward passes") as passes:
        compute = tasks.example_compute(bundle, asked.texts, asked.protocol, progress=passes)
        return run(faithfulness_plan(asked), compute, f"Faithfulness on {asked.model[0]}", "example")


def claims_plan(asked: Asked, scopes: Sequence[str] = faithfulness.RANK_SCOPES, sink: int = 0) -> sweep.Sweep:
    """The Claims page's run of ``asked``, as ``cwviz claims`` makes it (every rank scope, the first token's sink)."""
    bundle = services.get_bundle(*asked.model)
    return sweep.Sweep(CLAIMS, CLAIMS.settings(asked.protocol, scopes, sink, model_provenance(bundle)), asked.texts)


def run_claims(asked: Asked) -> sweep.Outcome:
    """:func:`claims_plan`'s unfinished items."""
    bundle = services.get_bundle(*asked.model)
    faithfulness.check_causal(bundle)

    def compute(index: int) -> dict:
        return claim_runs.item_payload(bundle, asked.texts[index], asked.protocol, faithfulness.RANK_SCOPES, 0, index)

    return run(claims_plan(asked), compute, f"Claims on {asked.model[0]}", "item")
