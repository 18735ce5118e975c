"""What a prompt and a selection must be before cwviz runs anything: the token limit, token ids, and the layer,
head and position checks (integers only: cwviz never guesses what a float, a bool or text meant)."""

from __future__ import annotations

import operator

import numpy as np
import torch

from ..util.errors import InputError, SelectionError
from ..util.settings import env_int
from ..util.texts import check_text
from .models import Bundle

#: The prompt length limit for a model whose config gives no positions (``CWVIZ_MAX_TOKENS`` to change it).
MAX_TOKENS = 32_768


def max_tokens(bundle: Bundle | None = None) -> int:
    """The prompt length limit: the model's positions (:data:`MAX_TOKENS` when its config names none),
    or ``$CWVIZ_MAX_TOKENS`` when that is lower (or the model is unknown)."""
    positions = int(bundle.info.max_positions) if bundle is not None and bundle.info.max_positions else None
    limit = env_int("CWVIZ_MAX_TOKENS", positions or MAX_TOKENS)
    return min(limit, positions) if positions else limit


def tokenize(bundle: Bundle, text: str) -> list[int]:
    """Token ids for ``text`` (with the tokenizer's own special tokens), checked against the limit.

    InputError for text that is not valid (:func:`~cwviz.core.util.texts.check_text`) and for a prompt of which the
    tokenizer keeps nothing but the special tokens it adds (a normaliser that drops zero-width characters leaves a
    BERT encoder [CLS] [SEP]); special tokens typed in the prompt count as text, and ids given as ``input_ids``
    are taken as they are.
    """
    if not isinstance(text, str):
        raise InputError(f"the prompt must be text, not {type(text).__name__}")
    if not text.strip():
        raise InputError("the prompt is empty; type some text to analyse")
    check_text(text)
    ids = check_length(bundle, bundle.tokenizer(text, add_special_tokens=True)["input_ids"])
    special = set(getattr(bundle.tokenizer, "all_special_ids", None) or ())
    if special and all(i in special for i in ids) and not bundle.tokenizer(text, add_special_tokens=False)["input_ids"]:
        raise InputError(
            "the prompt has no text the model's tokenizer keeps (it drops characters such as zero-width spaces, "
            "leaving only its special tokens); give some text to analyse"
        )
    return ids


def check_agree(bundle: Bundle, text: object, ids: list[int]) -> str:
    """``text`` when it is what the token ids ``ids`` say; InputError otherwise (both given to ``analyze``).

    They agree when the tokenizer makes ``ids`` of ``text`` exactly (with its special tokens, as :func:`tokenize`
    does), when ``text`` is the decoding of ``ids``, special tokens kept or skipped (what ``analyze`` records as the
    text of ids given alone; the dashboard's prompt and its generated continuation), or
    when ``ids`` decode to the same string as the text's own tokens do (special tokens kept): ids of
    the same text tokenised another way (a prompt and its generated continuation, tokenised apart) agree; ids of
    another text do not. Comparing decoded strings, not ``decode(ids) == text``, lets the tokenizer's own
    normalisation (a BERT encoder's lower case and spacing) apply to both sides. Special tokens count: the decoded
    strings are compared with them kept, so ``"<|im_start|>hello"`` and the ids of ``"hello"`` do not agree."""
    if not isinstance(text, str):
        raise InputError(f"the prompt must be text, not {type(text).__name__}")
    ids = list(ids)
    own = list(bundle.tokenizer(text, add_special_tokens=True)["input_ids"])
    decode = bundle.tokenizer.decode
    # Its own tokens, or its ids' own text (what analyze records for ids alone; the dashboard's prompt + continuation)
    if own == ids or text in (decode(ids), decode(ids, skip_special_tokens=True)):
        return text
    # the ids may leave out a BOS the tokenizer adds
    plain = list(bundle.tokenizer(text, add_special_tokens=False)["input_ids"])
    if decode(ids) in (decode(own), decode(plain)):
        return text
    if decode(ids, skip_special_tokens=True) == decode(own, skip_special_tokens=True):
        raise InputError(
            f"the text and input_ids differ in their special tokens: the text's tokens are {_shown(decode(own))}, the "
            f"ids {_shown(decode(ids))}; give the text or its ids, or both of one prompt"
        )
    raise InputError(
        f"input_ids are the tokens of {_shown(decode(ids, skip_special_tokens=True))}, not of the text given; give the "
        "text or its ids, or both of one prompt"
    )


def _shown(text: str) -> str:
    """``text`` quoted, cut to 40 characters."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def token_ids(value) -> list[int]:
    """Token ids as a list of ints from a 1-D sequence of integers: a list or tuple of ints (numpy integers
    included), or a 1-D integer numpy array or torch tensor. Anything else (text, a number, nested lists,
    None, floats, bools, 2-D arrays) raises InputError: cwviz never truncates a float or reads a digit."""
    type_name = type(value).__name__
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise InputError(f"input_ids must be a 1-D integer tensor, not {value.dim()}-D {value.dtype}")
        return [int(i) for i in value.tolist()]
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise InputError(f"input_ids must be a 1-D integer array, not {value.ndim}-D {value.dtype}")
        return [int(i) for i in value.tolist()]
    if not isinstance(value, (list, tuple)):
        raise InputError(
            f"input_ids must be a 1-D sequence of token ids (a list, tuple, numpy or torch 1-D array), not {type_name}"
        )
    for k, item in enumerate(value):
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise InputError(f"input_ids[{k}] is {item!r} ({type(item).__name__}); token ids must be integers")
    return [int(i) for i in value]


def check_length(bundle: Bundle, ids) -> list[int]:
    """``ids`` (:func:`token_ids`) checked against the length limit and the model's vocabulary."""
    ids = token_ids(ids)
    if not ids:
        raise InputError("the prompt gives no tokens; type some text to analyse")
    limit = max_tokens(bundle)
    if len(ids) > limit:
        source = "the model's maximum" if bundle.info.max_positions == limit else "set CWVIZ_MAX_TOKENS to change it"
        raise InputError(f"prompt has {len(ids):,} tokens; the limit is {limit:,} ({source})")
    vocab = getattr(bundle.model.config, "vocab_size", None)
    if vocab is not None and any(i < 0 or i >= vocab for i in ids):
        raise InputError(f"token ids must lie in 0..{vocab - 1} for this model")
    return ids


def integer_index(value, what: str) -> int:
    """``value`` as a Python int when it is an integer: an int, a numpy integer or a one-element integer
    tensor (anything with ``__index__``), never a bool. Anything else (``"1"``, ``1.0``, ``True``) raises
    SelectionError saying that ``what`` must be an integer: cwviz does not guess what a float or text meant."""
    dtype = str(getattr(value, "dtype", ""))
    if isinstance(value, (bool, np.bool_)) or dtype in ("bool", "torch.bool"):
        raise SelectionError(f"{what} must be an integer, not the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise SelectionError(f"{what} must be an integer, not {value!r} ({type(value).__name__})") from None


def check_layer(layer: int, num_layers: int, hint: str = "") -> int:
    """``layer`` as an int, or SelectionError naming the model's layers: the one layer check of cwviz
    (analyses, sinks, faithfulness, CLI). ``hint`` is added to the message (e.g. "or use all")."""
    layer = integer_index(layer, "a layer")
    if not 0 <= layer < num_layers:
        raise SelectionError(
            f"layer {layer} is out of range; this model has layers 0..{num_layers - 1}" + (f" ({hint})" if hint else "")
        )
    return layer
