"""Streamlit caching for the Atlas page: an atlas run (:func:`cwviz.analyses.atlas.run` of the prompts of a file, one
forward pass each through the one runner, a bar with the prompt in progress and an estimate) and a saved one
reloaded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import streamlit as st

from ..analyses import atlas
from ..analyses.codecs.sweeps import ATLAS
from ..core.util.errors import InputError
from ..core.util.texts import gsm8k_path
from . import hosting, links, run_services, services

#: Most prompts the page pools (each costs a forward pass); the CLI has no limit.
MAX_PROMPTS = 64
SOURCES = {
    "gsm8k": "GSM8K sample (ships with cwviz)",
    "path": "a JSONL file on the server",
    "saved": "saved results (a folder)",
}


@st.cache_data(max_entries=4, show_spinner=False)
def run_atlas(model: str, device: str, dtype: str, source: str, path: str, n: int, out: str = "") -> atlas.Atlas:
    """The atlas of the first ``n`` prompts of ``source`` (``"gsm8k"`` or ``"path"``) on the model; saved into
    ``out`` when given (:func:`cwviz.analyses.atlas.save`)."""
    if source == "gsm8k":
        file = gsm8k_path()
    elif source == "path":
        if not path.strip():
            raise InputError(
                "give the path of a JSONL file (one prompt a line: 'text', or GSM8K's 'question' and 'answer')"
            )
        hosting.policy_from_env().check_server_file(path)
        file = Path(path.strip())
    else:
        raise InputError(f"unknown source {source!r}; choose one of: {', '.join(SOURCES)}")
    if out.strip():
        hosting.policy_from_env().check_server_file(out)
    bundle = services.get_bundle(model, device, dtype)
    texts = services.pooled_prompts(bundle, file, n, MAX_PROMPTS)
    kept = run_services.store(ATLAS.name, f"{model}|{device}|{dtype}", texts)  # a stopped run's prompts: Run resumes
    steps = 2 * bundle.info.layers  # atlas.run's steps a prompt: its pass and its reduction, a layer each
    with services.item_bar(f"Atlas on {model}", len(texts), len(kept), "prompt", per_item=steps) as progress:
        result = atlas.run(bundle, texts, progress=progress, store=kept)
    if out.strip():
        atlas.save(result, out.strip())
    return result


@st.cache_data(max_entries=4, show_spinner="Loading the saved atlas…")
def load_atlas(folder: str, stamp: float) -> atlas.Atlas:
    """The atlas saved in ``folder`` (``stamp``: its manifest's modification time, so a rewritten folder is read
    again)."""
    hosting.policy_from_env().check_server_file(folder)
    return atlas.load(folder)


def stamp(folder: str) -> float:
    """The modification time of ``folder``'s manifest, 0 when there is none (:func:`load_atlas` then says what is
    missing)."""
    manifest = Path(folder.strip()) / atlas.FILES["manifest"]
    return manifest.stat().st_mtime if manifest.is_file() else 0.0


def heatmaps_link(request: services.Request, text: str, layer: int, head: int) -> str:
    """A link that opens the Heatmaps page on ``text`` with ``layer`` and ``head`` selected (a fresh session
    reads the link: :mod:`cwviz.app.state`)."""
    return links.page_url("heatmaps", replace(request, text=text), layer, head)
