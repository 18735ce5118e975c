"""What a model folder must hold before transformers reads it (:func:`cwviz.core.loading.models.load_model`): a config
that can build a model, weights whose headers read, and the tokenizer's files (:func:`check_folder`,
:func:`check_tokenizer_files`). Headers and file names only: milliseconds, before anything is loaded."""

from __future__ import annotations

import json
from pathlib import Path

from ..util.errors import ModelLoadError

#: The files that hold a tokenizer's vocabulary (fast tokenizers, SentencePiece, WordPiece, BPE, tiktoken), as
#: save_pretrained writes them: a model folder needs one of them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.txt",
    "vocab.json",
    "tekken.json",
)


def check_tokenizer_files(path: Path) -> None:
    """Refuse a model folder without its tokenizer's vocabulary (:data:`TOKENIZER_FILES`, or a ``*.tiktoken`` file).

    Without them transformers builds a tokenizer from the config alone, with an empty vocabulary: every word
    becomes ``[UNK]`` and the analysis is silently of another prompt. A tokenizer shipped as code (``auto_map`` in
    tokenizer_config.json, run only with trust_remote_code) is left to transformers."""
    if any((path / name).is_file() for name in TOKENIZER_FILES) or any(path.glob("*.tiktoken")):
        return
    config = path / "tokenizer_config.json"
    try:
        if config.is_file() and "auto_map" in json.loads(config.read_text(encoding="utf-8")):
            return
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
        pass
    raise ModelLoadError(
        f"{path} has no tokenizer files (tokenizer.json, tokenizer.model or vocab.txt); save the model's tokenizer "
        "into the folder too (tokenizer.save_pretrained(folder)) or copy its tokenizer files there from the model's "
        "source"
    )


#: Config fields that count something (heads, layers, widths; the names of several families): each must be a whole
#: number of at least 1 where it is given, or a list of such per layer (transformers divides by some of them while
#: building the model).
COUNT_FIELDS = (
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "hidden_size",
    "head_dim",
    "vocab_size",
    "n_head",
    "n_layer",
    "n_embd",
    "n_heads",
    "n_layers",
    "dim",
)


def check_folder(path: Path) -> None:
    """Refuse a model folder whose config or weights are broken, before transformers builds the model: config.json
    not a JSON object, a count field (:data:`COUNT_FIELDS`) below 1, or a ``.safetensors`` file whose header cannot
    be read or does not cover the file (truncated, or not safetensors). Reads the headers only (milliseconds)."""
    from safetensors import SafetensorError, safe_open

    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"{config_file} is not valid JSON ({err}); restore it from the model's source") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_file} must hold a JSON object of settings, not a {type(config).__name__}")
    sections = [config] + [v for v in config.values() if isinstance(v, dict)]  # a composite model's text_config too
    for section in sections:
        for key in COUNT_FIELDS:
            value = section.get(key)
            counts = value if isinstance(value, list) else [value]
            if value is not None and not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts):
                raise ModelLoadError(
                    f"{config_file} has {key}: {json.dumps(value)}; it must be a whole number of at least 1"
                )
    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(weights, framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise ModelLoadError(f"{weights} is damaged or truncated ({err}); copy or save the model again") from None
