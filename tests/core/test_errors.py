"""Bad input gets a clear exception in the library and one clear line with a non-zero exit in the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import cwviz
from cwviz.analyses.tables import decomposition
from cwviz.cli import main
from cwviz.core.util.errors import InputError, ModelLoadError, SelectionError, UnsupportedModelError
from tests.helpers import make_tiny


@pytest.fixture(scope="module")
def llama():
    return make_tiny("llama")


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_prompt(llama, text):
    with pytest.raises(InputError, match="empty"):
        cwviz.analyze(llama, text)


def test_prompt_over_the_limit(llama, monkeypatch):
    monkeypatch.setenv("CWVIZ_MAX_TOKENS", "10")
    with pytest.raises(InputError, match="11 tokens; the limit is 10 .*CWVIZ_MAX_TOKENS"):
        cwviz.analyze(llama, "a" * 11)
    assert cwviz.analyze(llama, "a" * 10).num_tokens == 10


def test_limit_never_exceeds_the_model_positions(llama):
    with pytest.raises(InputError, match="the model's maximum"):
        cwviz.analyze(llama, "a" * 300)  # max_position_embeddings is 256


def test_selection_out_of_range(llama):
    analysis = cwviz.analyze(llama, "hello")
    with pytest.raises(SelectionError, match="layers 0..1"):
        analysis.attention(2)
    with pytest.raises(SelectionError, match="heads 0..3"):
        decomposition(analysis, 0, 1, head=4)
    with pytest.raises(SelectionError, match="tokens 0..4"):
        decomposition(analysis, 0, 5)
    with pytest.raises(SelectionError):
        analysis.attention(-1)


def test_path_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        cwviz.load_model(str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match="expected a config.json"):
        cwviz.load_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="empty"):
        cwviz.load_model("  ")


def test_unknown_hub_id_offline_names_the_options(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="embedded"):
        cwviz.load_model("no-such-org/no-such-model-cwviz")


def test_unsupported_architecture_from_a_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    with pytest.raises(UnsupportedModelError, match="state-space model.*checked families: bert, cohere, distilbert"):
        cwviz.load_model(str(tmp_path))


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "args,message",
    [
        (["analyze", "--text", "   "], "error: the prompt is empty"),
        (["analyze", "--text", "hi", "--model", "/no/such/dir"], "error: no model at /no/such/dir"),
        (["analyze", "--file", "/no/such/file.txt"], "error: no file at /no/such/file.txt"),
        (["analyze", "--text", "hi", "--device", "tpu9"], "error: unknown device"),
    ],
)
def test_cli_bad_input_is_one_clear_line(args, message, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in err


def test_cli_non_utf8_file(tmp_path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café".encode("latin-1"))
    code, _, err = run_cli(["analyze", "--file", str(path)], capsys)
    assert code == 2 and "is not UTF-8 text" in err


def test_cli_selection_and_limit_errors(embedded, capsys, monkeypatch):
    code, _, err = run_cli(["analyze", "--text", "hello there", "--layer", "30"], capsys)
    assert code == 2 and err.strip() == "error: layer 30 is out of range; this model has layers 0..29"
    code, _, err = run_cli(["analyze", "--text", "hello there", "--head", "9"], capsys)
    assert code == 2 and "head 9 is out of range" in err
    monkeypatch.setenv("CWVIZ_MAX_TOKENS", "3")
    code, _, err = run_cli(["analyze", "--text", "one two three four five"], capsys)
    assert code == 2 and "the limit is 3" in err


def test_cli_unsupported_architecture(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    code, _, err = run_cli(["analyze", "--text", "hi", "--model", str(tmp_path)], capsys)
    assert code == 2 and "architecture 'mamba' is not supported" in err


def test_cli_analyze_end_to_end(tmp_path):
    """The real command in a fresh process: summary lines and the JSON file."""
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cwviz", "analyze", "--text", "-", "--layer", "5", "--json", str(out)],
        input="The capital of France is",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "top keys by attention" in proc.stdout and "first token's share" in proc.stdout
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [l["layer"] for l in data["layers"]] == [5]
    assert len(data["layers"][0]["heads"]) == 9
    assert data["tokens"][0] == "The"


def test_prompt_that_would_not_fit_is_refused_with_the_estimate(llama, monkeypatch):
    from cwviz.core.util.errors import ResourceError

    monkeypatch.setenv("CWVIZ_MEMORY_BYTES", "200000")  # 0.2 MB "available"
    # the variable named, and a size that does not read "0.0 GB"
    with pytest.raises(
        ResourceError,
        match=r"needs about .* only 0\.2 MB is available on cpu, as "
        r"CWVIZ_MEMORY_BYTES=200000 says",
    ) as err:
        cwviz.analyze(llama, "a" * 200)
    assert "raise or unset CWVIZ_MEMORY_BYTES" in str(err.value) and "0.0 GB" not in str(err.value)
    monkeypatch.setenv("CWVIZ_MEMORY_BYTES", "1000")
    with pytest.raises(ResourceError, match=r"only 1\.0 kB is available .* CWVIZ_MEMORY_BYTES=1000"):
        cwviz.analyze(llama, "a" * 200)
    monkeypatch.setenv("CWVIZ_MEMORY_BYTES", str(10**10))
    assert cwviz.analyze(llama, "a" * 200).num_tokens == 200


def test_memory_estimate_grows_with_the_square_of_the_prompt(llama):
    from cwviz.core.method.memory import estimate

    small, large = estimate(llama.model.config, llama.info, 100), estimate(llama.model.config, llama.info, 200)
    assert large["maps"] == 4 * small["maps"]
    assert large["recorded"] == 2 * small["recorded"]


def test_out_of_memory_during_analysis_becomes_a_clear_error(llama, monkeypatch):
    from cwviz.core.util.errors import ResourceError

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    analysis = cwviz.analyze(llama, "hello world")
    fresh = cwviz.analyze(llama, "hello world").layer(0)
    monkeypatch.setattr("cwviz.core.method.records_reader.layer_measures", boom)
    with pytest.raises(ResourceError, match="ran out of memory"):
        analysis.layer(0)
    monkeypatch.undo()
    after = analysis.layer(0)  # still usable afterwards, and nothing half-computed was kept: a fresh run's numbers
    torch.testing.assert_close(after.attention, fresh.attention)
    torch.testing.assert_close(after.contributions, fresh.contributions)


def test_model_load_advice_names_models_not_command_line_flags(monkeypatch):
    """The dashboard shows these messages too: a user there can type a model name, not pass a flag."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        cwviz.load_model("no-such-org/no-such-model-cwviz")
    message = str(err.value)
    assert "'embedded'" in message and "local folder" in message and ".gguf" in message
    assert "--" not in message and "HF_HUB_OFFLINE" not in message
