"""Resumable, data-parallel faithfulness sweeps (``cwviz faithfulness --results DIR``): records, resume,
sharding, and the refusals; tiny random models only (saved to disk for the subprocess runs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cwviz import cli
from cwviz.analyses import records as R
from cwviz.cli import faithfulness as command
from cwviz.core.util.parallel import shard
from tests.conftest import make_tiny

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [f"Example {i}: the {'quick ' * (i % 4)}brown fox jumps over dog {i}." for i in range(6)] + ["a"]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def sweep(tmp_path, monkeypatch, results: Path, *extra: str) -> int:
    monkeypatch.setattr(command, "load", lambda _args: make_tiny("llama"))
    data = write_jsonl(tmp_path / "items.jsonl", TEXTS)
    args = ["faithfulness", "--jsonl", str(data), "--n", "10", "--rates", "10,50", "--measures", "raw,random", "--results", str(results)]
    return cli.main([*args, *extra])


def lines(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob(R.RECORD_GLOB)) for line in path.read_text().splitlines()]


def test_a_sweep_writes_one_record_per_example_and_the_summary_from_them(tmp_path, monkeypatch, capsys):
    results = tmp_path / "run"
    assert sweep(tmp_path, monkeypatch, results) == 0
    records = lines(results)
    assert [r["example"] for r in records] == list(range(len(TEXTS)))
    assert records[-1]["skipped"] and not records[0]["skipped"]  # "a" has one token: recorded as skipped
    assert {r["text_sha256"] for r in records} == {R.text_hash(t) for t in TEXTS}
    assert len(records[0]["runs"]) == 2 * 2 * 2
    summary = pd.read_csv(results / R.SUMMARY)
    assert set(summary.n) == {len(TEXTS) - 1}
    manifest = json.loads((results / R.MANIFEST).read_text())
    assert manifest["model"]["id"] == "tiny-llama" and manifest["rates"] == [10.0, 50.0] and manifest["processes"] == 1
    assert manifest["command"].startswith("cwviz faithfulness --jsonl") and manifest["versions"]["torch"]
    # a second run into the same folder without --resume is refused, with the fix
    assert sweep(tmp_path, monkeypatch, results) == 2
    assert "--resume" in capsys.readouterr().err


def test_resume_after_a_partial_run_and_a_truncated_line_gives_the_uninterrupted_summary(tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    assert sweep(tmp_path, monkeypatch, whole) == 0
    part = tmp_path / "part"
    part.mkdir()
    records = (whole / "records-00000.jsonl").read_text().splitlines(keepends=True)
    # three finished examples, then the fourth cut off mid-write
    (part / "records-00000.jsonl").write_text("".join(records[:3]) + records[3][: len(records[3]) // 2])
    assert sweep(tmp_path, monkeypatch, part, "--resume") == 0
    assert [r["example"] for r in lines(part)] == list(range(len(TEXTS)))  # nothing lost, nothing twice
    assert (part / R.SUMMARY).read_text() == (whole / R.SUMMARY).read_text()


def test_resume_refuses_other_settings_and_other_texts(tmp_path, monkeypatch, capsys):
    results = tmp_path / "run"
    assert sweep(tmp_path, monkeypatch, results) == 0
    assert sweep(tmp_path, monkeypatch, results, "--resume", "--seed", "3") == 2
    assert "other settings" in capsys.readouterr().err
    TEXTS_BEFORE = list(TEXTS)
    try:
        TEXTS[2] = "a different second text"
        assert sweep(tmp_path, monkeypatch, results, "--resume") == 2
        assert "example 2" in capsys.readouterr().err
    finally:
        TEXTS[:] = TEXTS_BEFORE


@pytest.mark.parametrize("name", ["sinks", "atlas"])
def test_sinks_and_atlas_resume_a_partial_run_to_the_uninterrupted_records_and_tables(tmp_path, monkeypatch, name):
    """In one process, with a tiny model: the records a resumed sinks or atlas sweep ends with, and the tables it
    recomputes from them, are those of an uninterrupted run; a second run without --resume is refused."""
    from cwviz.cli import atlas, sinks

    module = {"sinks": sinks, "atlas": atlas}[name]
    monkeypatch.setattr(module, "load", lambda _args: make_tiny("llama"))
    data = write_jsonl(tmp_path / "items.jsonl", TEXTS[:4])
    extra = ["--bootstrap", "50"] if name == "atlas" else []

    def run(results: Path, *more: str) -> int:
        return cli.main([name, "--jsonl", str(data), "--results", str(results), *extra, *more])

    whole, part = tmp_path / "whole", tmp_path / "part"
    assert run(whole) == 0
    assert run(whole) == 2  # a folder with records wants --resume
    folder = records_folder(whole, name)
    kept = (folder / "records-00000.jsonl").read_text().splitlines(keepends=True)
    records_folder(part, name).mkdir(parents=True)
    (records_folder(part, name) / "records-00000.jsonl").write_text(kept[0] + kept[1][: len(kept[1]) // 2])  # cut mid-write
    assert run(part, "--resume") == 0
    assert R.read_records(records_folder(part, name), name) == R.read_records(folder, name)
    assert summaries(part, name) == summaries(whole, name)


def test_malformed_records_are_named_by_file_and_line(tmp_path, monkeypatch, capsys):
    results = tmp_path / "run"
    assert sweep(tmp_path, monkeypatch, results) == 0
    path = results / "records-00000.jsonl"
    text = path.read_text().splitlines(keepends=True)
    path.write_text(text[0] + "{not json\n" + "".join(text[1:]))
    capsys.readouterr()
    assert sweep(tmp_path, monkeypatch, results, "--resume") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: line 2 of") and len(err.strip().splitlines()) == 1
    with pytest.raises(Exception, match="no results folder"):
        R.read_records(tmp_path / "missing")


def test_processes_share_the_pending_examples_without_overlap():
    pending = [0, 2, 3, 5, 8, 9, 11]
    shares = [shard(pending, i, 3) for i in range(3)]
    assert sorted(sum(shares, [])) == pending
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_two_shards_written_apart_merge_into_the_single_process_records(tmp_path, monkeypatch):
    single = tmp_path / "single"
    assert sweep(tmp_path, monkeypatch, single) == 0
    split = tmp_path / "split"
    split.mkdir()
    records = lines(single)
    for index in range(2):  # what two processes would write, each its own file
        (split / f"records-{index:05d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shard(records, index, 2)))
    assert R.read_records(split) == R.read_records(single)


# -- subprocesses: a tiny model saved to disk ---------------------------------------------------------
def save_tiny_model(folder: Path) -> Path:
    import torch
    import transformers
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0} | {chr(i): i - 31 for i in range(32, 127)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


#: The three commands that run through the sweep runner, the files of their summary, and where their records go.
COMMANDS = {
    "faithfulness": ([R.SUMMARY], ""),
    "sinks": (["layers.csv", "heads.csv"], "sinks"),
    "atlas": (["per_prompt.csv", "pooled.csv", "prompts.jsonl"], ""),
}


def cwviz_command(model: Path, data: Path, results: Path, command: str = "faithfulness") -> list[str]:
    common = ["--jsonl", str(data), "--examples", "200", "--model", str(model), "--device", "cpu", "--results", str(results)]
    extra = {"faithfulness": ["--rates", "10,50"], "sinks": [], "atlas": ["--bootstrap", "50"]}[command]
    return [command, *common, *extra]


def records_folder(results: Path, command: str) -> Path:
    return results / COMMANDS[command][1]


def summaries(results: Path, command: str) -> dict[str, str]:
    """The files a command's summary is in, recomputed from the records."""
    return {name: (records_folder(results, command) / name).read_text() for name in COMMANDS[command][0]}


ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))


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
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli.main(argv) == 0
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_two_processes_under_torchrun_give_exactly_the_single_process_records(tmp_path, command):
    model = save_tiny_model(tmp_path / "model")
    texts = TEXTS * 2 if command == "faithfulness" else TEXTS[:-1] * 2  # sinks' ΔPPL needs two tokens a prompt
    data = write_jsonl(tmp_path / "items.jsonl", texts)
    single, double = tmp_path / "single", tmp_path / "double"
    run_here(cwviz_command(model, data, single, command))
    launch(cwviz_command(model, data, double, command), processes=2)
    folder, kind = records_folder(double, command), command
    assert sorted(p.name for p in folder.glob(R.RECORD_GLOB)) == ["records-00000.jsonl", "records-00001.jsonl"]
    assert all(p.stat().st_size > 0 for p in folder.glob(R.RECORD_GLOB))  # both processes did work
    assert R.read_records(folder, kind) == R.read_records(records_folder(single, command), kind)
    assert summaries(double, command) == summaries(single, command)
    assert json.loads((folder / R.MANIFEST).read_text())["processes"] == 2


@pytest.mark.slow
def test_sigkill_then_resume_loses_nothing_and_duplicates_nothing(tmp_path, command="faithfulness"):
    """The runner's durability (a record fsynced as it is made, a torn last line ignored, --resume completing the
    rest), once: it is one implementation for every command (cwviz.analyses.sweep.run), and each command's own
    resume is tested in process (test_sinks_and_atlas_resume_a_partial_run_to_the_uninterrupted_records_and_tables)."""
    model = save_tiny_model(tmp_path / "model")
    texts = [f"Item {i}: " + "the river flows past the old mill " * (1 + i % 3) for i in range(60)]  # long enough to kill mid-run
    data = write_jsonl(tmp_path / "items.jsonl", texts)
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    run = cwviz_process(cwviz_command(model, data, killed, command))
    proc = subprocess.Popen(run, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = R.records_path(records_folder(killed, command), 0)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not path.exists() or path.read_text().count("\n") < 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = path.read_text().count("\n")
    assert 5 <= kept < len(texts)  # killed mid-run
    with path.open("a") as handle:
        handle.write(f'{{"schema": "{R.schema(command)}", "exam')  # as if killed mid-write
    done = subprocess.run([*run, "--resume"], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    examples = [json.loads(line)["example"] for line in path.read_text().splitlines()]
    assert sorted(examples) == list(range(len(texts)))  # each example exactly once
    run_here(cwviz_command(model, data, whole, command))
    assert summaries(killed, command) == summaries(whole, command)
