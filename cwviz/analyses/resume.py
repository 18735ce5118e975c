"""Resuming a sweep: is the work a results folder (or the records kept in memory) already holds this run's?

A record counts as done only when it was made with this run's settings (its fingerprint) on this run's text of its
example (its ``text_sha256``); anything else is refused, naming what differs: each setting, old and new, when the
folder's manifest names its settings (:func:`setting_changes`). :mod:`cwviz.analyses.sweep` asks
:func:`check_resumable` before a run appends to a folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from os import PathLike

from ..core.util.errors import InputError
from .records import shown


def _flat(value: object, prefix: str = "") -> dict[str, object]:
    """A settings object as ``{"protocol.rates": [1, 5], ...}``, tuples as lists (as JSON reads them back)."""
    value = json.loads(json.dumps(value, default=str))
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, object] = {}
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        flat |= _flat(item, name) if isinstance(item, dict) else {name: item}
    return flat


def setting_changes(old: object, new: dict) -> list[str]:
    """Each setting that differs between a run's settings ``old`` (a manifest's ``settings``) and ``new``, as
    ``"name: old -> new"`` (``(none)`` for one the other lacks), in name order."""
    before, after = _flat(old), _flat(new)
    return [
        f"{name}: {shown(before.get(name, '(none)'))} -> {shown(after.get(name, '(none)'))}"
        for name in sorted(before.keys() | after.keys())
        if before.get(name, "(none)") != after.get(name, "(none)")
    ]


def check_resumable(
    records: Iterable[dict], key: str, hashes: Sequence[str], folder: str | PathLike, changes: Sequence[str] = ()
) -> set[int]:
    """The examples already finished, after checking that every record was made by the same settings
    (``key``) on the same texts (``hashes[i]`` of example i); InputError naming the mismatch otherwise (each setting
    that differs, old and new, when ``changes`` names them: :func:`setting_changes`). Records beyond this run's
    examples mean a smaller ``--n`` than the run's, not other data: that is what it says."""
    records = list(records)
    beyond = sorted(r["example"] for r in records if r["example"] >= len(hashes))
    done = set()
    for record in records:
        example = record["example"]
        if record["fingerprint"] != key:
            which = (
                f": {'; '.join(changes)}"
                if changes
                else " (protocol, model, task or sink; its manifest.json, written before manifests named the settings, "
                "cannot say which)"
            )
            raise InputError(
                f"the records in {folder} were made with other settings than this run{which}; "
                "rerun with the same options, or give a fresh --results folder"
            )
        if example < len(hashes) and record["text_sha256"] != hashes[example]:
            raise InputError(
                f"example {example} in {folder} was made from another text than this run's example {example}; "
                "the data changed: give the same data, or a fresh --results folder"
            )
        done.add(example)
    if beyond:
        raise InputError(
            f"{folder} holds records of {beyond[-1] + 1} examples but this run has {len(hashes)} (a smaller --n); "
            f"resume with --n {beyond[-1] + 1} or more, or give a fresh --results folder"
        )
    return done
