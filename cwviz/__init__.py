"""cwviz: contribution weights for attention layers of Hugging Face models.

>>> from cwviz import load_model, analyze
>>> bundle = load_model("embedded")
>>> a = analyze(bundle, "The capital of France is")
>>> a.contributions(layer=3, kind="inter").shape   # [head, query, key]
"""

from .analysis import Analysis, analyze, max_tokens
from .errors import CwvizError, InputError, ModelLoadError, ResourceError, SelectionError, UnsupportedModelError
from .measures import MEASURES
from .models import Bundle, ModelInfo, bundle_from_model, load_model

__version__ = "0.1.0"

__all__ = [
    "Analysis",
    "Bundle",
    "CwvizError",
    "InputError",
    "MEASURES",
    "ModelInfo",
    "ModelLoadError",
    "ResourceError",
    "SelectionError",
    "UnsupportedModelError",
    "analyze",
    "bundle_from_model",
    "load_model",
    "max_tokens",
]
