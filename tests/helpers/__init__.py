"""What tests share: tiny random models of every supported architecture built from configs (no downloads), the
texts and data they run on, and small checks. Test modules import these from here, never from each other or from
conftest.py (tests/test_layout.py checks); fixtures live in the conftest.py files. The dashboard's helpers are in
tests/helpers/app.py, the browser's in tests/helpers/browser.py (each imports what the others need not)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import torch
import transformers

import cwviz
import cwviz.cli

ROOT = Path(__file__).resolve().parents[2]
#: The environment of a ``python -m cwviz`` subprocess: one thread, offline, this checkout first on the path.
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))


# -- tiny models --------------------------------------------------------------------------------------
class CharTokenizer:
    """A stand-in tokenizer for tiny models: one token per character, ids = code point mod vocab."""

    def __init__(self, vocab_size: int = 100):
        self.vocab_size = vocab_size

    def __call__(self, text, add_special_tokens=True, **_):
        return {"input_ids": [ord(c) % self.vocab_size for c in text]}

    def decode(self, ids, **_):
        return "".join(chr(97 + int(i) % 26) for i in ids)

    def convert_ids_to_tokens(self, i):
        return chr(97 + int(i) % 26)


def tiny_config(arch: str):
    """Small configs with the features that matter: grouped-query attention, biases, partial rotary."""
    common = dict(vocab_size=100, num_hidden_layers=2, max_position_embeddings=256)
    if arch == "llama":
        return transformers.LlamaConfig(
            hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, **common
        )
    if arch == "mistral":
        return transformers.MistralConfig(
            hidden_size=64,
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=1,
            sliding_window=8,
            **common,
        )
    if arch == "qwen2":
        # Qwen2 has biases on q, k and v.
        return transformers.Qwen2Config(
            hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, **common
        )
    if arch == "qwen3":
        return transformers.Qwen3Config(
            hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=24, **common
        )
    if arch == "gpt2":
        return transformers.GPT2Config(
            vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0
        )
    if arch == "gpt_neox":
        return transformers.GPTNeoXConfig(
            hidden_size=64, intermediate_size=96, num_attention_heads=4, rotary_pct=0.25, attention_bias=True, **common
        )
    if arch == "bert":
        return transformers.BertConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, **common)
    raise ValueError(arch)


ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "bert"]

#: Every row of cwviz's architecture table, and a few model types that run through a derived row, as tiny
#: configs with the feature that matters for each (AutoConfig.for_model keyword arguments; 2 layers, width 64).
DECODER = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
ENCODER = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_hidden_layers=2,
    vocab_size=100,
    max_position_embeddings=64,
)
_MOE = dict(num_experts_per_tok=2)
FAMILY_CONFIGS: dict[str, dict] = {
    "llama": DECODER,
    "mistral": dict(DECODER, num_key_value_heads=1, sliding_window=8),
    "qwen2": DECODER,  # q/k/v biases
    "qwen3": dict(DECODER, head_dim=24),  # q/k norms, a head width that is not hidden / heads
    "olmo2": DECODER,  # q/k norms over all heads
    "mixtral": dict(DECODER, num_local_experts=4, sliding_window=None, **_MOE),
    "qwen2_moe": dict(DECODER, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, **_MOE),
    "qwen3_moe": dict(DECODER, num_experts=4, moe_intermediate_size=32, head_dim=16, **_MOE),
    "gemma": dict(DECODER, head_dim=16),
    # soft-capping strong enough to matter, alternating sliding (4) and global layers, final logit soft-capping
    "gemma2": dict(
        DECODER,
        head_dim=16,
        query_pre_attn_scalar=20,
        attn_logit_softcapping=1.5,
        final_logit_softcapping=2.0,
        sliding_window=4,
        initializer_range=0.3,
    ),
    "gemma3_text": dict(
        DECODER,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=3.0,
    ),
    # fused qkv_proj, partial rotary
    "phi3": dict(DECODER, partial_rotary_factor=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "granite": dict(
        DECODER, attention_multiplier=0.3, logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5
    ),
    "stablelm": dict(
        DECODER, partial_rotary_factor=0.25, use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=True
    ),
    "starcoder2": dict(DECODER, sliding_window=6, use_bias=True),
    "cohere": dict(DECODER, logit_scale=0.5, use_qk_norm=True),
    "gpt_oss": dict(DECODER, head_dim=16, num_local_experts=4, sliding_window=4, **_MOE),  # learned sinks
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64),
    "gpt_neox": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, rotary_pct=0.25, attention_bias=True),
    "bert": ENCODER,
    "roberta": dict(ENCODER, pad_token_id=1),
    "xlm-roberta": dict(ENCODER, pad_token_id=1),
    "electra": dict(ENCODER, embedding_size=32),
    "distilbert": dict(dim=64, hidden_dim=96, n_heads=4, n_layers=2, vocab_size=100, max_position_embeddings=64),
    "modernbert": dict(
        ENCODER,
        global_attn_every_n_layers=2,
        local_attention=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    ),
    # no row in the table: derived at load time
    "phi": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, partial_rotary_factor=0.5),
    "opt": dict(hidden_size=64, ffn_dim=96, num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=64),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, multi_query=True),
    "persimmon": dict(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, partial_rotary_factor=0.5, qk_layernorm=True
    ),
    "camembert": dict(ENCODER, pad_token_id=1),  # an encoder (RoBERTa layout) through a derived row
}
#: Model types above that have no row of their own.
DERIVED_FAMILIES = ("phi", "opt", "gpt_bigcode", "persimmon", "camembert")


def family_model(model_type: str, seed: int = 0, **overrides):
    """A tiny random transformers model of ``model_type`` (:data:`FAMILY_CONFIGS`, with ``overrides``), float32,
    biases random."""
    from cwviz.core.loading import architectures
    from cwviz.core.loading.models import auto_class_name

    torch.manual_seed(seed)
    kwargs = dict(vocab_size=100, num_hidden_layers=2, max_position_embeddings=64)
    if model_type in ("gpt2", "gpt_bigcode", "distilbert"):
        kwargs = dict(vocab_size=100)
    config = transformers.AutoConfig.for_model(model_type, **{**kwargs, **FAMILY_CONFIGS[model_type], **overrides})
    auto = getattr(transformers, auto_class_name(config, architectures.ARCHITECTURES.get(model_type)))
    model = auto.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random biases and norm weights, so their handling is exercised
        for name, param in model.named_parameters():
            if name.endswith("bias") or "sinks" in name:
                param.normal_(0, 0.5 if "sinks" in name else 0.1)
    return model


def make_tiny(arch: str, seed: int = 0) -> cwviz.Bundle:
    torch.manual_seed(seed)
    config = tiny_config(arch)
    auto = transformers.AutoModelForMaskedLM if arch == "bert" else transformers.AutoModelForCausalLM
    model = auto.from_config(config)
    with torch.no_grad():  # random biases, so bias handling is exercised (from_config zero-initialises them)
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
    return cwviz.bundle_from_model(model, CharTokenizer(config.vocab_size), model_id=f"tiny-{arch}")


TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps."


def run_together(work, jobs) -> tuple[dict, list]:
    """Call ``work(job)`` for every job, each in its own thread, all released at once by a barrier.

    Returns the results by job and the exceptions raised (for the caller to assert there are none).
    """
    barrier = threading.Barrier(len(jobs))
    results, errors = {}, []

    def run(job):
        try:
            barrier.wait()
            results[job] = work(job)
        except Exception as err:  # surfaced by the caller
            errors.append(err)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def default_signals() -> None:
    """``preexec_fn`` of a child a test interrupts: SIGINT and SIGTERM as a fresh shell gives them. A pytest started
    with SIGINT ignored (``nohup``, a background job) passes SIG_IGN on, and Python then never raises
    KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_command(args: list[str], env: dict | None = None):
    """``python -m cwviz ARGS`` started in a subprocess at the checkout's root, standard output and error pipes (text),
    unbuffered (each print reaches the pipe at once), with the signals a shell gives (:func:`default_signals`)."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "cwviz", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
        preexec_fn=default_signals,
    )


def no_hooks(model) -> bool:
    """Nothing is registered on any module of ``model`` (cwviz never registers hooks)."""
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# -- saved models and data files ----------------------------------------------------------------------
def save_with_tokenizer(model, folder) -> str:
    """``model`` and a one-token-per-character tokenizer, as save_pretrained writes them."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0} | {chr(i): i - 31 for i in range(32, 127)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    model.save_pretrained(folder)
    return str(folder)


def save_tiny_model(folder: Path) -> Path:
    """A tiny llama and its tokenizer saved to ``folder``, for the subprocess runs (``--model FOLDER``)."""
    config = transformers.LlamaConfig(
        vocab_size=96,  # the tokenizer's: [UNK] and the 95 printable ASCII characters
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    save_with_tokenizer(transformers.AutoModelForCausalLM.from_config(config), folder)
    return folder


def save_first_layers(folder: Path, layers: int) -> str:
    """The embedded model's first ``layers`` layers (its own weights, embeddings and output layer) and its tokenizer,
    saved to ``folder``: a model the dashboard and the CLI load from a folder, with the embedded model's width,
    heads and vocabulary, in a fraction of its time where the time is the layers'."""
    from cwviz.core.loading import checkpoints

    source = checkpoints.embedded_dir()
    config = transformers.AutoConfig.from_pretrained(source)
    config.num_hidden_layers = layers
    transformers.AutoModelForCausalLM.from_pretrained(source, config=config).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return str(folder)


def write_jsonl(path: Path, rows: list) -> Path:
    """One JSON object a line: a row as given, or ``{"text": row}`` for a string."""
    path.write_text(
        "".join(json.dumps({"text": r} if isinstance(r, str) else r) + "\n" for r in rows), encoding="utf-8"
    )
    return path


# -- texts and files ----------------------------------------------------------------------------------
#: 512 characters (tokens, under :class:`CharTokenizer`) for the long-prompt tests.
LONG_TEXT = ("The river bends below the mill. " * 20)[:512]

#: Odd but valid prompts: each must analyse and show as text.
ODD_PROMPTS = {
    "emoji": "I love pizza 🍕🔥 and 👩‍👩‍👧 families",
    "cjk": "東京は日本の首都です。北京是中国的首都。",
    "rtl": "مرحبا بالعالم و שלום עולם",
    "combining": "e\u0301 a\u0308 Z\u0337\u0338 n\u0303",
    "control": "tab\there\rnul\x00bell\x07 bidi\u202eevil\u202c zero\u200bwidth",
    "html": '<img src=x onerror=alert(1)> <script>alert("x")</script>',
    "special": "<|im_start|>user\nHi<|im_end|><|endoftext|>",
    "one_token": "Hello",
}

#: The start of a PNG file: what a user uploads by mistake where a text file belongs.
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00" + bytes(range(256)) * 8

#: Two BoolQ items (passage, question, answer).
BOOLQ = [
    {
        "passage": "The sun is a star at the centre of the solar system.",
        "question": "is the sun a star",
        "answer": True,
    },
    {"passage": "Whales are mammals that live in the sea.", "question": "are whales fish", "answer": False},
]


def tiny_long_bundle() -> cwviz.Bundle:
    """``tiny-long``: a 2-layer llama allowing 1024 positions, one token per character (for 512-token prompts)."""
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    return cwviz.bundle_from_model(model, CharTokenizer(100), model_id="tiny-long")


def window(tokens: int, size: int | None = None, causal: bool = True) -> np.ndarray:
    """Which keys each query sees, bool [query, key]: causal (j <= i) and, with ``size``, the last ``size`` keys
    (i - j < size, transformers' sliding window); not causal: |i - j| <= size // 2 (ModernBERT's local layers)."""
    i, j = np.arange(tokens)[:, None], np.arange(tokens)[None, :]
    if not causal:
        return np.ones((tokens, tokens), bool) if size is None else np.abs(i - j) <= size // 2
    return (j <= i) & (True if size is None else i - j < size)


# -- claims records (cwviz claims, its page) ----------------------------------------------------------
def record(example: int, ppl: dict, sinks: dict | None = None, scope: str = "token") -> dict:
    """A whole claims record (one a results folder's reader accepts) with ΔPPL ``ppl[(curve, measure)]`` at rate 10
    under ``scope``: clean perplexity 50, each masked one 50 + ΔPPL."""
    clean = 50.0
    runs = [
        {
            "measure": m,
            "curve": c,
            "rate": 10.0,
            "ppl_masked": clean + v,
            "delta_ppl": (clean + v) - clean,
            "correct_masked": None,
        }
        for (c, m), v in ppl.items()
    ]
    payload = {"task": "text", "skipped": False, "tokens": 12, "ppl_clean": clean, "correct_clean": None, "runs": runs}
    return {"example": example, "skipped": False, "tokens": 12, "faithfulness": {scope: payload}, "sinks": sinks or {}}


def ordered(i: int, step: float, noise: float = 0.0) -> dict:
    """ΔPPL in the paper's order with gaps ``step`` (comprehensiveness rising, sufficiency falling)."""
    from cwviz.analyses import claims

    rng = np.random.default_rng(i)
    out = {}
    for rank, measure in enumerate(claims.ORDER):
        out["comprehensiveness", measure] = 1 + step * rank + noise * rng.normal()
        out["sufficiency", measure] = 10 - step * rank + noise * rng.normal()
    return out


def sinks(
    i: int,
    d: float = 0.3,
    cos: float = -0.3,
    shape: float = 0.9,
    spread: float = 0.1,
    toward: float = 0.1,
    ppl: float = 0.5,
    noise: float = 0.01,
    d_other: float = 0.0,
    near: float = 0.05,
    control: float = 0.0,
) -> dict:
    """A record's sink statistics (every name of ``cwviz.analyses.codecs.checks.SINK_STATS``) near the given values of
    each verdict (``noise`` apart from item to item): claim 2's d_σ − d_other ≈ ``d`` (d_other ≈ ``d_other``), claim 3's
    sink-active cosine ``cos``, claim 4's U-shaped share ``shape`` and operating distance ``near``, claim 5's (a)
    ``spread``, (b) ``toward`` and (c) log-perplexity ratio ``ppl`` with the sink's value removed, and the control's
    log-perplexity ratio ``control`` (its spread and turn half the sink's)."""
    r = np.random.default_rng(100 + i // 2).normal(size=10) * noise * (-1) ** i  # items 2k and 2k + 1 cancel: mean 0
    return {
        "rho_geometry": 0.5 + d + d_other + r[0],
        "rho_attention": 0.5 + r[1],
        "rho_geometry_other": 0.5 + d_other + r[7],
        "rho_attention_other": 0.5,
        "cos_sink_rest": 0.0,
        "cos_active_0.1": cos / 2,
        "cos_active_0.3": cos + r[2],
        "cos_active_0.5": cos,
        "cos_active_0.7": cos,
        "cos_weighted": cos / 2,
        "interior_minimum_share": 0.95,
        "median_minimiser": 0.7,
        "u_shaped_share": min(1.0, max(0.0, shape + r[3])),
        "fitted_heads": 30.0,
        "fit_minimiser": 0.6,
        "operating_ratio": 0.4,
        "above_minimum_share": 0.2,
        "operating_distance": near + r[8],
        "operating_offset": -near,
        "operating_heads": 12.0,
        "cone_change": -0.01,
        "low_cone_change": spread + r[4],
        "low_centroid_change": toward + r[5],
        "log_ppl_ratio": ppl + r[6],
        "delta_ppl": 10 * (ppl + r[6]),
        "control_low_cone_change": spread / 2,
        "control_low_centroid_change": toward / 2,
        "control_log_ppl_ratio": control + r[9],
        "control_delta_ppl": 10 * control,
        "control_in_band_share": 0.5,
        "control_mass_ratio": 0.9,
    }


# -- charts -------------------------------------------------------------------------------------------
def map_views(spec: dict) -> list[dict]:
    """A, B and B − A of :func:`cwviz.charts.compare.compare_maps`, in a row, two above one, or stacked."""
    if "hconcat" in spec:
        return spec["hconcat"]
    rows = spec["vconcat"]
    return [view for row in rows for view in row.get("hconcat", [row])]


def datasets(chart) -> list[list[dict]]:
    """The rows of every dataset of the chart's Vega-Lite spec (``to_dict`` also validates the spec)."""
    return list(chart.to_dict()["datasets"].values())


def table_rows(frame) -> list[dict]:
    """A table's rows as JSON-like dicts (NaN as None, as a chart spec holds them)."""
    import math

    return [
        {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
        for row in frame.to_dict(orient="records")
    ]


def assert_drawn_from(chart, table) -> None:
    """The chart is one of Altair's chart types and one of its datasets is ``table``: same rows, same values."""
    import altair as alt

    assert isinstance(chart, (alt.Chart, alt.LayerChart, alt.HConcatChart, alt.VConcatChart))
    expected = table_rows(table)
    assert expected, "the table to compare with is empty"
    assert expected in datasets(chart), f"no dataset of the chart equals the table ({len(expected)} rows)"


def write_tiny_gguf(path, layers: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
    """A llama GGUF of random float32 weights with a byte-level BPE tokenizer of 261 tokens, written with the gguf
    package: a user's .gguf in miniature (its conversion takes seconds, not the half minute of SmolLM2's)."""
    import gguf
    import numpy as np
    from tokenizers.pre_tokenizers import ByteLevel

    byte_tokens = sorted(ByteLevel.alphabet())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_tokens, "Ġt", "he"]
    merges = ["Ġ t", "h e"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    rng = np.random.default_rng(0)

    def tensor(name, *shape):
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    d_head = hidden // heads
    tensor("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.attn_q.weight", heads * d_head, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * d_head, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * d_head, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, heads * d_head)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.ffn_gate.weight", 2 * hidden, hidden)
        tensor(f"blk.{i}.ffn_up.weight", 2 * hidden, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, 2 * hidden)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    tensor("output.weight", len(tokens), hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -- the CLI in-process, on copies of results folders ---------------------------------------------------------
def call(argv: list, capsys) -> tuple[int, str, str]:
    """``cli.main(argv)`` in this process: its exit status, stdout and stderr."""
    from cwviz import cli

    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str) -> bool:
    """Exit status 2 and exactly one line, ``error: ...``."""
    lines = err.strip().splitlines()
    return code == 2 and len(lines) == 1 and lines[0].startswith("error: ")


def copy(made: Path, name: str, to: Path) -> Path:
    """A copy of the folder ``made / name`` at ``to / name`` (a test damages the copy)."""
    return Path(shutil.copytree(made / name, to / name))


def edit_record(folder: Path, line: int, change, checksum: bool = False) -> None:
    """``change`` (record -> anything) the record on line ``line`` (0 the first) of process 0's records file in
    ``folder``; with ``checksum`` its checksum is made again (a forged record: the checks beneath the checksum
    alone)."""
    from cwviz.analyses import records

    path = records.records_path(folder, 0)
    lines = path.read_text().splitlines()
    record = json.loads(lines[line])
    change(record)
    if checksum:
        record[records.CHECKSUM] = records.record_checksum(record)
    lines[line] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


#: The prompts of the sweep tests (the last one a single token: skipped where two are needed).
SWEEP_TEXTS = [f"Example {i}: the {'quick ' * (i % 4)}brown fox jumps over dog {i}." for i in range(6)] + ["a"]


def cwviz_process(argv: list[str], processes: int = 1) -> list[str]:
    """``python -m cwviz ARGV`` in one process, or under ``torchrun --nproc_per_node N`` (gloo on the CPU)."""
    if processes == 1:
        return [sys.executable, "-m", "cwviz", *argv]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "-m", "cwviz", *argv]


def launch(argv: list[str], processes: int = 1, timeout: int = 600) -> None:
    done = subprocess.run(cwviz_process(argv, processes), env=ENV, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]


def run_here(argv: list[str]) -> None:
    """The single-process reference, in this process (``cli.main``, the path ``python -m cwviz`` takes), on one
    thread as the launched processes run (ENV), so that the floats are summed in the same order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cwviz.cli.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
