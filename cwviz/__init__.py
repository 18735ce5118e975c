"""cwviz: contribution weights for attention layers of Hugging Face models.

>>> from cwviz import load_model, analyze
>>> bundle = load_model("embedded")
>>> a = analyze(bundle, "The capital of France is")
>>> a.contributions(layer=3, kind="inter").shape   # [head, query, key]

Names are imported on first use (PEP 562), so ``import cwviz.charts`` stays free of torch and
transformers. Layout: :mod:`cwviz.core` (model adapter, capture, measures), :mod:`cwviz.analyses`
(tables, sinks, faithfulness), :mod:`cwviz.charts` (Altair), :mod:`cwviz.plot` (charts from an
Analysis, for notebooks), :mod:`cwviz.app` (the Streamlit dashboard), :mod:`cwviz.cli`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The one place the version is written (pyproject.toml reads it from here).
__version__ = "0.2.0"

_NAMES = {
    "Analysis": "cwviz.core.method.analysis",
    "analyze": "cwviz.core.method.analysis",
    "max_tokens": "cwviz.core.loading.inputs",
    "Bundle": "cwviz.core.loading.models",
    "ModelInfo": "cwviz.core.loading.models",
    "bundle_from_model": "cwviz.core.loading.models",
    "load_model": "cwviz.core.loading.models",
    "MEASURES": "cwviz.core.method.measures",
    "to_dict": "cwviz.core.method.export",
    "to_json": "cwviz.core.method.export",
    "decomposition": "cwviz.analyses.tables",
    "flow": "cwviz.core.method.flow",
    "attribute": "cwviz.core.method.attribution",
    "CwvizError": "cwviz.core.util.errors",
    "InputError": "cwviz.core.util.errors",
    "ModelChangedError": "cwviz.core.util.errors",
    "ModelLoadError": "cwviz.core.util.errors",
    "ResourceError": "cwviz.core.util.errors",
    "SelectionError": "cwviz.core.util.errors",
    "UnsupportedModelError": "cwviz.core.util.errors",
}
_MODULES = {"sinks": "cwviz.analyses.sinks", "faithfulness": "cwviz.analyses.faithfulness", "plot": "cwviz.plot"}

__all__ = [
    "Analysis",
    "Bundle",
    "CwvizError",
    "InputError",
    "MEASURES",
    "ModelChangedError",
    "ModelInfo",
    "ModelLoadError",
    "ResourceError",
    "SelectionError",
    "UnsupportedModelError",
    "analyze",
    "attribute",
    "bundle_from_model",
    "decomposition",
    "faithfulness",
    "flow",
    "load_model",
    "max_tokens",
    "plot",
    "sinks",
    "to_dict",
    "to_json",
]

if TYPE_CHECKING:
    from .analyses import faithfulness, sinks
    from .analyses.tables import decomposition
    from .core.loading.inputs import max_tokens
    from .core.loading.models import Bundle, ModelInfo, bundle_from_model, load_model
    from .core.method.analysis import Analysis, analyze
    from .core.method.attribution import attribute
    from .core.method.export import to_dict, to_json
    from .core.method.flow import flow
    from .core.method.measures import MEASURES
    from .core.util.errors import (
        CwvizError,
        InputError,
        ModelChangedError,
        ModelLoadError,
        ResourceError,
        SelectionError,
        UnsupportedModelError,
    )


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'cwviz' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
