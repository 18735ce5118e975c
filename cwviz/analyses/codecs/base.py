"""What every record type's codec shares (:mod:`~cwviz.analyses.codecs.sweeps` and
:mod:`~cwviz.analyses.codecs.checks` hold the codecs themselves): the :class:`Codec` base, the field types that
several codecs' payloads and manifests use, and the range and identity checks their ``validate`` calls
(:func:`in_range`, :func:`agrees`)."""

from __future__ import annotations

import math
from pathlib import Path

from ...core.util.errors import InputError
from ..records import Field, is_int, is_number, list_of, shown

COUNT: Field = (lambda v: is_int(v) and v >= 1, "a positive integer")
NUMBERS: Field = (list_of(is_number), "a list of numbers")
NAMES: Field = (list_of(lambda v: isinstance(v, str)), "a list of names")


def data_count(key: str) -> Field:
    """The manifest's ``data`` object, with its positive ``key`` count (the run's examples or prompts)."""
    return (lambda v: isinstance(v, dict) and COUNT[0](v.get(key)), f"an object with its '{key}' count")


def model_settings(provenance: dict) -> dict:
    """What of the model's provenance (:func:`cwviz.core.loading.provenance.model_provenance`) decides the numbers (not
    the device)."""
    return {k: provenance[k] for k in ("id", "architecture", "revision", "weights_sha256", "dtype")}


def same_length(columns: dict, where: str, fix: str) -> None:
    if len({len(v) for v in columns.values()}) > 1:
        raise InputError(f"{where}: its columns differ in length (a cut or edited record); {fix}")


#: Room for rounding at a range's ends (a share summed in float32 may reach 1 + 1e-7).
SLACK = 1e-5


def in_range(
    values, low: float, high: float, where: str, name: str, fix: str, nan: bool = False, what: str = ""
) -> None:
    """InputError naming ``where`` and ``name`` unless every value (one, or a list) lies in [low, high] (within
    :data:`SLACK`) and is finite; with ``nan``, NaN is allowed too (a statistic with no row to average), and so is an
    infinite bound reached (a perplexity that overflowed)."""
    for value in values if isinstance(values, list) else [values]:
        if math.isnan(value) or math.isinf(value):
            if nan and (math.isnan(value) or value in (low, high)):
                continue
        elif low - SLACK <= value <= high + SLACK:
            continue
        span = f"from {low:g} to {high:g}" if high != math.inf else f"{low:g} or more"
        raise InputError(
            f"{where}: {name!r} must be {what or 'a number'} {span}{' or NaN' if nan else ''}, not "
            f"{shown(value)}; {fix}"
        )


def agrees(stated: float, computed: float) -> bool:
    """Does a stored result equal what its own fields give (NaN where they give NaN)? The tolerance covers only the
    rounding of one float64 subtraction: the record holds the operands as written."""
    if math.isnan(computed) or math.isnan(stated):
        return math.isnan(computed) and math.isnan(stated)
    return math.isclose(stated, computed, rel_tol=1e-9, abs_tol=1e-12)


class Codec:
    """What every record type has; a type with no check beyond its fields' types keeps these (module docstring)."""

    name: str
    payload: dict[str, Field]
    manifest_fields: dict[str, Field]

    @property
    def schema(self) -> str:
        return f"cwviz.{self.name}.record"

    def validate(self, record: dict, where: str, fix: str) -> None:
        """Nothing beyond the fields' types (:data:`payload`)."""

    def validate_run(self, records: list[dict], manifest: dict | None, folder: Path, fix: str) -> None:
        """Nothing beyond one fingerprint and one text per example (:func:`cwviz.analyses.records.check_one_run`)."""

    def describe(self, records: list[dict]) -> str:
        return ""

    def __repr__(self) -> str:
        return f"<codec {self.name}>"
