"""The one runner (:mod:`cwviz.analyses.sweep`): resumable, data-parallel sweeps into a results folder (``cwviz
faithfulness --results DIR``, sinks, atlas): records, resume, sharding and the refusals; and in memory: cancel, Ctrl-C
and a rerun resuming from the kept records. Tiny random models only (saved to disk for the subprocess runs)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from cwviz import cli
from cwviz.analyses import faithfulness, records, sweep
from cwviz.analyses.codecs import checks, sweeps
from cwviz.analyses.codecs.checks import CLAIMS
from cwviz.analyses.codecs.sweeps import FAITHFULNESS
from cwviz.cli import faithfulness as command
from cwviz.core.util.errors import InputError
from cwviz.core.util.parallel import shard
from tests.helpers import ENV, cwviz_process, launch, make_tiny, run_here, save_tiny_model, write_jsonl
from tests.helpers import SWEEP_TEXTS as TEXTS

ROOT = Path(__file__).resolve().parents[2]
#: Every record type by its name (``cwviz.<name>.record``).
BY_NAME = {
    codec.name: codec
    for codec in (sweeps.FAITHFULNESS, sweeps.SINKS, sweeps.ATLAS, checks.CLAIMS, checks.FLOW_FAITHFULNESS)
}


def run_faithfulness(tmp_path, monkeypatch, results: Path, *extra: str) -> int:
    monkeypatch.setattr(command, "load", lambda _args: make_tiny("llama"))
    data = write_jsonl(tmp_path / "items.jsonl", TEXTS)
    args = [
        "faithfulness",
        "--jsonl",
        str(data),
        "--n",
        "10",
        "--rates",
        "10,50",
        "--measures",
        "raw,random",
        "--results",
        str(results),
    ]
    return cli.main([*args, *extra])


def lines(folder: Path) -> list[dict]:
    return [
        json.loads(line) for path in sorted(folder.glob(records.RECORD_GLOB)) for line in path.read_text().splitlines()
    ]


def test_a_sweep_writes_one_record_per_example_and_the_summary_from_them(tmp_path, monkeypatch, capsys):
    results = tmp_path / "run"
    assert run_faithfulness(tmp_path, monkeypatch, results) == 0
    written = lines(results)
    assert [r["example"] for r in written] == list(range(len(TEXTS)))
    assert written[-1]["skipped"] and not written[0]["skipped"]  # "a" has one token: recorded as skipped
    assert {r["text_sha256"] for r in written} == {records.text_hash(t) for t in TEXTS}
    # raw and each random draw, 2 curves, 2 rates
    assert len(written[0]["runs"]) == (1 + faithfulness.Protocol().draws) * 2 * 2
    summary = pd.read_csv(results / records.SUMMARY)
    assert set(summary.n) == {len(TEXTS) - 1}
    gaps = pd.read_csv(results / records.GAPS)  # the random control beside the summary: raw's gap, each curve and rate
    assert set(gaps.measure) == {"raw"} and len(gaps) == 2 * 2 and set(gaps.n) == {len(TEXTS) - 1}
    manifest = json.loads((results / records.MANIFEST).read_text())
    assert manifest["model"]["id"] == "tiny-llama" and manifest["rates"] == [10.0, 50.0] and manifest["processes"] == 1
    assert manifest["command"].startswith("cwviz faithfulness --jsonl") and manifest["versions"]["torch"]
    # a second run into the same folder without --resume is refused, with the fix
    assert run_faithfulness(tmp_path, monkeypatch, results) == 2
    assert "--resume" in capsys.readouterr().err


def test_resume_after_a_partial_run_and_a_truncated_line_gives_the_uninterrupted_summary(tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    assert run_faithfulness(tmp_path, monkeypatch, whole) == 0
    part = tmp_path / "part"
    part.mkdir()
    written = (whole / "records-00000.jsonl").read_text().splitlines(keepends=True)
    # three finished examples, then the fourth cut off mid-write
    (part / "records-00000.jsonl").write_text("".join(written[:3]) + written[3][: len(written[3]) // 2])
    assert run_faithfulness(tmp_path, monkeypatch, part, "--resume") == 0
    assert [r["example"] for r in lines(part)] == list(range(len(TEXTS)))  # nothing lost, nothing twice
    assert (part / records.SUMMARY).read_text() == (whole / records.SUMMARY).read_text()
    assert (part / records.GAPS).read_text() == (whole / records.GAPS).read_text()


def test_resume_refuses_other_settings_and_other_texts(tmp_path, monkeypatch, capsys):
    results = tmp_path / "run"
    assert run_faithfulness(tmp_path, monkeypatch, results) == 0
    assert run_faithfulness(tmp_path, monkeypatch, results, "--resume", "--seed", "3") == 2
    assert "other settings" in capsys.readouterr().err
    TEXTS_BEFORE = list(TEXTS)
    try:
        TEXTS[2] = "a different second text"
        assert run_faithfulness(tmp_path, monkeypatch, results, "--resume") == 2
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
    # cut mid-write
    (records_folder(part, name) / "records-00000.jsonl").write_text(kept[0] + kept[1][: len(kept[1]) // 2])
    assert run(part, "--resume") == 0
    assert records.read_records(records_folder(part, name), BY_NAME[name]) == records.read_records(
        folder, BY_NAME[name]
    )
    assert summaries(part, name) == summaries(whole, name)


@pytest.mark.parametrize("name", ["sinks", "atlas"])
def test_with_or_without_a_results_folder_a_command_writes_the_same_tables(tmp_path, monkeypatch, name):
    """Both go through the runner: in memory the records keep numpy columns, in a folder JSON lists read back; the
    tables a user gets (``--csv``, ``--out``) are the same to the byte."""
    from cwviz.cli import atlas, sinks

    module = {"sinks": sinks, "atlas": atlas}[name]
    monkeypatch.setattr(module, "load", lambda _args: make_tiny("llama"))
    data = write_jsonl(tmp_path / "items.jsonl", TEXTS[:3])
    out = {"sinks": ["--csv"], "atlas": ["--bootstrap", "50", "--out"]}[name]
    assert cli.main([name, "--jsonl", str(data), *out, str(tmp_path / "memory")]) == 0
    assert (
        cli.main([name, "--jsonl", str(data), *out, str(tmp_path / "folder"), "--results", str(tmp_path / "results")])
        == 0
    )
    paths = [tmp_path / "memory"] if name == "sinks" else sorted((tmp_path / "memory").iterdir())
    for path in paths:
        assert path.read_bytes() == (tmp_path / "folder" / path.relative_to(tmp_path / "memory")).read_bytes(), (
            path.name
        )


def test_malformed_records_are_named_by_file_and_line(tmp_path, monkeypatch, capsys):
    results = tmp_path / "run"
    assert run_faithfulness(tmp_path, monkeypatch, results) == 0
    path = results / "records-00000.jsonl"
    text = path.read_text().splitlines(keepends=True)
    path.write_text(text[0] + "{not json\n" + "".join(text[1:]))
    capsys.readouterr()
    assert run_faithfulness(tmp_path, monkeypatch, results, "--resume") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: line 2 of") and len(err.strip().splitlines()) == 1
    with pytest.raises(Exception, match="no results folder"):
        records.read_records(tmp_path / "missing", FAITHFULNESS)


def test_processes_share_the_pending_examples_without_overlap():
    pending = [0, 2, 3, 5, 8, 9, 11]
    shares = [shard(pending, i, 3) for i in range(3)]
    assert sorted(sum(shares, [])) == pending
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_two_shards_written_apart_merge_into_the_single_process_records(tmp_path, monkeypatch):
    single = tmp_path / "single"
    assert run_faithfulness(tmp_path, monkeypatch, single) == 0
    split = tmp_path / "split"
    split.mkdir()
    written = lines(single)
    for index in range(2):  # what two processes would write, each its own file
        (split / f"records-{index:05d}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in shard(written, index, 2))
        )
    assert records.read_records(split, FAITHFULNESS) == records.read_records(single, FAITHFULNESS)


# -- the runner in memory (a page's run, a command without --results) ------------------------------------------
def counting(calls: list[int], stop_at: int | None = None, error: type[BaseException] | None = None):
    """``compute(index)``: records its calls, and raises ``error`` on the call numbered ``stop_at``."""

    def compute(index: int) -> dict:
        calls.append(index)
        if error is not None and len(calls) == stop_at:
            raise error
        return {"value": index * 10}

    return compute


def test_a_cancelled_run_keeps_its_finished_items_and_a_rerun_resumes_from_them():
    """``cancel()`` is asked before each item: the items finished before it said stop are returned and kept in the
    caller's store, and a run of the same settings and texts with that store computes only the rest."""
    plan = sweep.Sweep(CLAIMS, {"seed": 1}, ["first", "second", "third", "fourth"])
    calls: list[int] = []
    store: dict[int, dict] = {}
    steps: list[tuple[int, int]] = []
    cancelled = sweep.run(
        plan, counting(calls), progress=lambda *step: steps.append(step), cancel=lambda: len(calls) == 2, store=store
    )
    assert cancelled.interrupted and [r["example"] for r in cancelled.records] == [0, 1] and sorted(store) == [0, 1]
    assert steps == [(1, 4), (2, 4)]
    record = cancelled.records[1]
    assert record["fingerprint"] == plan.key == records.fingerprint({"seed": 1})  # the run's real fingerprint
    assert (
        record["text_sha256"] == records.text_hash("second")
        and record["schema"] == CLAIMS.schema
        and record["value"] == 10
    )
    resumed = sweep.run(plan, counting(calls), progress=lambda *step: steps.append(step), store=store)
    assert not resumed.interrupted and calls == [0, 1, 2, 3]  # nothing twice
    assert [r["example"] for r in resumed.records] == [0, 1, 2, 3] and resumed.records[:2] == cancelled.records
    assert steps[2:] == [(1, 2), (2, 2)]
    with pytest.raises(InputError, match="other settings"):  # a store holds one run's records
        sweep.run(sweep.Sweep(CLAIMS, {"seed": 2}, plan.texts), counting(calls), store=store)


def test_ctrl_c_ends_an_in_memory_run_with_the_finished_items_and_anything_else_leaves_them_in_the_store():
    plan = sweep.Sweep(CLAIMS, {}, ["a", "b", "c"])
    outcome = sweep.run(plan, counting([], stop_at=2, error=KeyboardInterrupt))  # Ctrl-C or SIGTERM (cwviz.cli.main)
    assert outcome.interrupted and [r["example"] for r in outcome.records] == [0]
    store: dict[int, dict] = {}
    with pytest.raises(RuntimeError):  # an error, or a page's Stop (Streamlit's interruption of the script)
        sweep.run(plan, counting([], stop_at=3, error=RuntimeError), store=store)
    assert sorted(store) == [0, 1]


# -- subprocesses: a tiny model saved to disk ---------------------------------------------------------


#: The three commands that run through the sweep runner, the files of their summary, and where their records go.
COMMANDS = {
    "faithfulness": ([records.SUMMARY, records.GAPS], ""),
    "sinks": (["layers.csv", "heads.csv"], "sinks"),
    "atlas": (["per_prompt.csv", "pooled.csv", "prompts.jsonl"], ""),
}


def cwviz_command(model: Path, data: Path, results: Path, command: str = "faithfulness") -> list[str]:
    common = [
        "--jsonl",
        str(data),
        "--examples",
        "200",
        "--model",
        str(model),
        "--device",
        "cpu",
        "--results",
        str(results),
    ]
    extra = {"faithfulness": ["--rates", "10,50"], "sinks": [], "atlas": ["--bootstrap", "50"]}[command]
    return [command, *common, *extra]


def records_folder(results: Path, command: str) -> Path:
    return results / COMMANDS[command][1]


def summaries(results: Path, command: str) -> dict[str, str]:
    """The files a command's summary is in, recomputed from the records."""
    return {name: (records_folder(results, command) / name).read_text() for name in COMMANDS[command][0]}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_two_processes_under_torchrun_give_exactly_the_single_process_records(tmp_path, command):
    model = save_tiny_model(tmp_path / "model")
    texts = TEXTS * 2 if command == "faithfulness" else TEXTS[:-1] * 2  # sinks' ΔPPL needs two tokens a prompt
    data = write_jsonl(tmp_path / "items.jsonl", texts)
    single, double = tmp_path / "single", tmp_path / "double"
    run_here(cwviz_command(model, data, single, command))
    launch(cwviz_command(model, data, double, command), processes=2)
    folder = records_folder(double, command)
    assert sorted(p.name for p in folder.glob(records.RECORD_GLOB)) == ["records-00000.jsonl", "records-00001.jsonl"]
    assert all(p.stat().st_size > 0 for p in folder.glob(records.RECORD_GLOB))  # both processes did work
    assert records.read_records(folder, BY_NAME[command]) == records.read_records(
        records_folder(single, command), BY_NAME[command]
    )
    assert summaries(double, command) == summaries(single, command)
    assert json.loads((folder / records.MANIFEST).read_text())["processes"] == 2


@pytest.mark.slow
def test_sigkill_then_resume_loses_nothing_and_duplicates_nothing(tmp_path, command="faithfulness"):
    """The runner's durability (a record fsynced as it is made, a torn last line ignored, --resume completing the
    rest), once: it is one implementation for every command (cwviz.analyses.sweep.run), and each command's own
    resume is tested in process (test_sinks_and_atlas_resume_a_partial_run_to_the_uninterrupted_records_and_tables)."""
    model = save_tiny_model(tmp_path / "model")
    # long enough to kill mid-run
    texts = [f"Item {i}: " + "the river flows past the old mill " * (1 + i % 3) for i in range(60)]
    data = write_jsonl(tmp_path / "items.jsonl", texts)
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    run = cwviz_process(cwviz_command(model, data, killed, command))
    proc = subprocess.Popen(run, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = records.records_path(records_folder(killed, command), 0)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not path.exists() or path.read_text().count("\n") < 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = path.read_text().count("\n")
    assert 5 <= kept < len(texts)  # killed mid-run
    with path.open("a") as handle:
        handle.write(f'{{"schema": "{BY_NAME[command].schema}", "exam')  # as if killed mid-write
    done = subprocess.run([*run, "--resume"], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    examples = [json.loads(line)["example"] for line in path.read_text().splitlines()]
    assert sorted(examples) == list(range(len(texts)))  # each example exactly once
    run_here(cwviz_command(model, data, whole, command))
    assert summaries(killed, command) == summaries(whole, command)
