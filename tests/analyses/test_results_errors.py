"""Results folders read back and written safely (issue 34, the data side): one run owns a folder at a time, every
file read back is checked (records, manifests, summaries, atlas and sinks tables), out-of-range numbers are refused
up front, text and input_ids must agree, and writes are whole or absent.

The real folders are made once per module with a tiny random model (two short prompts); each test damages a copy.
The CLI runs in-process (``cli.main``) except where two processes must race for one folder.
"""

from __future__ import annotations

import errno
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cwviz
from cwviz import cli
from cwviz.analyses import atlas, records
from cwviz.analyses.codecs.sweeps import FAITHFULNESS
from cwviz.cli import atlas as atlas_cli
from cwviz.cli import faithfulness as faith_cli
from cwviz.cli import sinks as sinks_cli
from cwviz.core.util.errors import CwvizError, InputError
from tests.helpers import ENV, call, copy, edit_record, make_tiny, refused, save_tiny_model, write_jsonl

TEXTS = ["The quick brown fox jumps over the dog.", "A second, rather longer example sentence here."]
OTHER = ["Another run's first text, not this one.", "And its second text, also different."]
FAITH = ["--rates", "10,50", "--measures", "raw,random"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Real folders: ``run`` (faithfulness + sinks, 2 examples), ``atlas`` (2 prompts), and ``other``/``other_atlas``
    made by another run (other settings and texts); the undamaged answers of report, --resume and atlas --load."""
    root = tmp_path_factory.mktemp("made")
    with pytest.MonkeyPatch.context() as patch:
        for module in (faith_cli, sinks_cli, atlas_cli):
            patch.setattr(module, "load", lambda _args: make_tiny("llama"))
        data, other = write_jsonl(root / "data.jsonl", TEXTS), write_jsonl(root / "other.jsonl", OTHER)
        for folder, jsonl, rates in ((root / "run", data, "10,50"), (root / "other", other, "10")):
            assert (
                cli.main(
                    [
                        "faithfulness",
                        "--jsonl",
                        str(jsonl),
                        "--rates",
                        rates,
                        "--measures",
                        "raw,random",
                        "--results",
                        str(folder),
                    ]
                )
                == 0
            )
            assert cli.main(["sinks", "--jsonl", str(jsonl), "--results", str(folder)]) == 0
        for folder, jsonl in ((root / "atlas", data), (root / "other_atlas", other)):
            assert cli.main(["atlas", "--jsonl", str(jsonl), "--bootstrap", "20", "--results", str(folder)]) == 0
    return root


def without_date(html: str) -> str:
    """The report less what differs between two renders of one folder: the date, and the SVG gradients' ids
    (vl-convert numbers them in order within a process)."""
    html = re.sub(r"gradient_\d+", "gradient_N", html)
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "DATE", html)


def report(folder: Path, out: Path, capsys) -> tuple[int, str, str]:
    code, stdout, err = call(["report", "--results", folder, "--out", out], capsys)
    return code, stdout, (without_date(out.read_text()) if code == 0 else err)


def resume(folder: Path, data: Path, capsys, *extra: str) -> tuple[int, str]:
    return call(["faithfulness", "--jsonl", data, *FAITH, "--results", folder, "--resume", *extra], capsys)[::2]


@pytest.fixture
def tiny_loads(monkeypatch):
    for module in (faith_cli, sinks_cli, atlas_cli):
        monkeypatch.setattr(module, "load", lambda _args: make_tiny("llama"))


# -- one owner at a time -----------------------------------------------------------------------------------
def test_a_folder_in_use_is_refused_as_busy_before_the_model_loads(made, tmp_path, capsys, monkeypatch):
    folder = copy(made, "run", tmp_path)
    monkeypatch.setattr(faith_cli, "load", lambda _args: pytest.fail("the model loaded for a busy folder"))
    with records.folder_lock(folder):  # another run holds it
        code, _, err = call(
            ["faithfulness", "--jsonl", made / "data.jsonl", *FAITH, "--results", folder, "--resume"], capsys
        )
    assert refused(code, err) and "busy" in err and "--resume" in err
    with records.folder_lock(folder):  # released when that run ends: the folder is free again
        pass


def test_a_killed_run_leaves_no_stuck_lock(tmp_path):
    """The OS drops the flock with the process: a run SIGKILLed while it holds the folder leaves it free."""
    holder = (
        f"import sys, time; from cwviz.analyses import records\nwith records.folder_lock({str(tmp_path)!r}):\n "
        "print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match="busy"), records.folder_lock(tmp_path):
            pass
    finally:
        proc.kill()
        proc.wait()
    with records.folder_lock(tmp_path):  # no stale lock after SIGKILL
        pass


@pytest.mark.slow
def test_two_runs_started_at_once_on_one_folder_write_each_example_once(tmp_path):
    """Two ``cwviz faithfulness`` processes on one folder: one runs, the other is refused (one error line): as busy
    while the first runs, or, where the first finished before the second started (a loaded machine), as a folder
    that already holds a run; no example is recorded twice."""
    model = save_tiny_model(tmp_path / "model")
    data = write_jsonl(tmp_path / "items.jsonl", TEXTS * 3)
    argv = [
        sys.executable,
        "-m",
        "cwviz",
        "faithfulness",
        "--jsonl",
        str(data),
        "--model",
        str(model),
        "--device",
        "cpu",
    ]
    argv += [*FAITH, "--results", str(tmp_path / "run")]
    procs = [
        subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    (err,) = [err for code, err in results if code == 2]
    assert refused(2, err) and ("busy" in err or "already holds" in err), err
    examples = [
        json.loads(line)["example"] for line in records.records_path(tmp_path / "run", 0).read_text().splitlines()
    ]
    assert sorted(examples) == list(range(len(TEXTS) * 3))


def test_two_runs_in_threads_of_one_process_are_refused_too(made, tmp_path):
    """flock belongs to the open file: a second holder in the same process is refused as well."""
    folder = copy(made, "run", tmp_path)
    errors = []
    with records.folder_lock(folder):

        def second():
            try:
                with records.folder_lock(folder):
                    pass
            except InputError as err:
                errors.append(str(err))

        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
    assert errors and "busy" in errors[0]


# -- records checked on read -------------------------------------------------------------------------------
def records_file(folder: Path) -> Path:
    return records.records_path(folder, 0)


def test_a_hand_added_record_of_example_minus_one_is_refused_not_counted(made, tmp_path, capsys, tiny_loads):
    folder = copy(made, "run", tmp_path)
    record = json.loads(records_file(folder).read_text().splitlines()[0]) | {"example": -1}
    with records_file(folder).open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    code, err = resume(folder, made / "data.jsonl", capsys)
    assert refused(code, err) and "'example'" in err
    code, _, err = report(folder, tmp_path / "r.html", capsys)
    assert refused(code, err)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda r: r.pop("runs"), "'runs'"),
        (lambda r: r["runs"][0].update(delta_ppl="abc"), "'delta_ppl'"),
        (lambda r: r.update(example=7), "'example'"),
        (lambda r: r.update(tokens=True), "'tokens'"),
    ],
)
def test_a_record_missing_a_key_or_of_the_wrong_type_is_refused_by_resume_and_report(
    made, tmp_path, capsys, tiny_loads, change, named
):
    folder = copy(made, "run", tmp_path)
    edit_record(folder, 1, change)
    code, err = resume(folder, made / "data.jsonl", capsys)
    assert refused(code, err) and named in err and "line 2" in err
    code, _, err = report(folder, tmp_path / "r.html", capsys)
    assert refused(code, err) and named in err


def test_records_of_two_runs_with_other_settings_are_refused_by_every_reader(made, tmp_path, capsys, tiny_loads):
    """Records of a run with rates 10 beside those of a run with rates 10, 50: report and --resume both refuse,
    naming the settings that differ and what to do."""
    folder = copy(made, "run", tmp_path)
    mixed = (
        records_file(folder).read_text().splitlines()[:1] + records_file(made / "other").read_text().splitlines()[1:]
    )
    records_file(folder).write_text("\n".join(mixed) + "\n")
    for code, err in (resume(folder, made / "data.jsonl", capsys), report(folder, tmp_path / "r.html", capsys)[::2]):
        assert refused(code, err) and "2 runs with different settings" in err
        assert "rates 10, 50" in err and "rates 10;" in err and "fresh --results folder" in err


def test_a_manifest_of_other_settings_than_the_records_is_refused(made, tmp_path, capsys):
    folder = copy(made, "run", tmp_path)
    shutil.copy(made / "other" / records.MANIFEST, folder / records.MANIFEST)
    code, _, err = report(folder, tmp_path / "r.html", capsys)
    assert refused(code, err) and "manifest" in err and "settings" in err


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda m: m | {"seed": "abc"}, "'seed'"),
        (lambda m: [m], "JSON list"),
        (lambda m: {k: v for k, v in m.items() if k != "rates"}, "'rates'"),
    ],
)
def test_a_manifest_edited_by_hand_is_refused_clearly(made, tmp_path, capsys, tiny_loads, edit, named):
    folder = copy(made, "run", tmp_path)
    (folder / records.MANIFEST).write_text(json.dumps(edit(json.loads((folder / records.MANIFEST).read_text()))))
    for code, err in (report(folder, tmp_path / "r.html", capsys)[::2], resume(folder, made / "data.jsonl", capsys)):
        assert refused(code, err) and named in err and "manifest" in err


def test_a_smaller_n_on_resume_says_so_not_that_the_data_changed(made, tmp_path, capsys, tiny_loads):
    folder = copy(made, "run", tmp_path)
    code, err = resume(folder, made / "data.jsonl", capsys, "--n", "1")
    assert refused(code, err) and "--n 2" in err and "data changed" not in err


# -- the property: damaged copies of a real folder ---------------------------------------------------------
def retyped(value):
    """A value of another JSON type than ``value``."""
    if isinstance(value, str):
        return 123
    if isinstance(value, (list, dict)):
        return "abc"
    return "abc" if not isinstance(value, bool) else "yes"


@st.composite
def damages(draw, files: list[str]):
    """(file, how) of one damage: a cut, a line dropped, a key dropped or retyped, a CSV cell made text, or the file of
    another run."""
    name = draw(st.sampled_from(files))
    how = draw(st.sampled_from(["cut", "drop_line", "drop_key", "retype", "other_run"]))
    return name, how, draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6))


def damage(folder: Path, other: Path, name: str, how: str, a: int, b: int) -> None:
    path = folder / name
    data = path.read_text()
    if how == "other_run":
        shutil.copy(other / name, path)
        return
    if how == "cut":
        path.write_text(data[: a % max(len(data), 1)])
        return
    lines = data.splitlines(keepends=True)
    if how == "drop_line":
        del lines[a % len(lines)]
        path.write_text("".join(lines))
        return
    if name.endswith(".csv"):  # a column dropped, or a cell made text
        rows = [line.rstrip("\n").split(",") for line in lines]
        column = b % len(rows[0])
        if how == "drop_key":
            rows = [row[:column] + row[column + 1 :] for row in rows]
        else:
            rows[1 + a % (len(rows) - 1)][column] = "abc"
        path.write_text("".join(",".join(row) + "\n" for row in rows))
        return
    number = a % len(lines) if name.endswith(".jsonl") else 0
    value = json.loads(lines[number]) if name.endswith(".jsonl") else json.loads(data)
    target = value
    if isinstance(value, dict) and isinstance(value.get("runs"), list) and value["runs"] and b % 3 == 0:
        target = value["runs"][b % len(value["runs"])]  # a key of one masked run
    if not isinstance(target, dict) or not target:
        return
    key = sorted(target)[b % len(target)]
    if how == "drop_key":
        del target[key]
    else:
        target[key] = retyped(target[key])
    text = json.dumps(value)
    if name.endswith(".jsonl"):
        lines[number] = text + "\n"
        path.write_text("".join(lines))
    else:
        path.write_text(text)


_WHOLE: dict[Path, tuple] = {}


def undamaged_report(made: Path, base: Path, capsys) -> tuple[int, str, str]:
    if made not in _WHOLE:
        _WHOLE[made] = report(made / "run", base / "whole.html", capsys)
    return _WHOLE[made]


#: What the report reads and checks: display-only manifest keys (the command, versions, date) are shown as they are.
REPORT_MANIFEST_KEYS = ["fingerprint", "seed", "rates", "measures", "data", "schema"]
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FEW
@given(
    hit=damages(
        ["records-00000.jsonl", "sinks/records-00000.jsonl", "sinks/layers.csv", "sinks/heads.csv", "summary.csv"]
    )
)
def test_report_of_a_damaged_folder_is_a_clear_refusal_or_the_undamaged_report(made, tmp_path_factory, capsys, hit):
    base = tmp_path_factory.mktemp("report")
    whole = undamaged_report(made, base, capsys)
    folder = copy(made, "run", base)
    damage(folder, made / "other", *hit)
    code, out, answer = report(folder, base / "damaged.html", capsys)
    if code == 0 and answer != whole[2]:
        # Only an unfinished run's report differs (whole records missing, as after an interrupt), and it says so.
        assert "holds 1 of the run's 2 examples" in out, (hit, out)
    else:
        assert (code, answer) == whole[::2] or refused(code, answer), (hit, answer)


@FEW
@given(
    key=st.sampled_from(REPORT_MANIFEST_KEYS),
    how=st.sampled_from(["drop_key", "retype", "cut", "other_run"]),
    at=st.integers(0, 10**6),
)
def test_report_of_a_folder_with_a_damaged_manifest_is_a_clear_refusal_or_the_undamaged_report(
    made, tmp_path_factory, capsys, key, how, at
):
    base = tmp_path_factory.mktemp("manifest")
    whole = undamaged_report(made, base, capsys)
    folder = copy(made, "run", base)
    manifest = json.loads((folder / records.MANIFEST).read_text())
    if how in ("drop_key", "retype"):
        manifest.pop(key) if how == "drop_key" else manifest.update({key: retyped(manifest[key])})
        (folder / records.MANIFEST).write_text(json.dumps(manifest))
    else:
        damage(folder, made / "other", records.MANIFEST, how, at, 0)
    code, _, answer = report(folder, base / "damaged.html", capsys)
    assert (code, answer) == whole[::2] or refused(code, answer), (key, how, answer)


@FEW
@given(hit=damages(["records-00000.jsonl", "manifest.json", "summary.csv"]))
def test_resume_of_a_damaged_folder_is_a_clear_refusal_or_the_undamaged_records_and_summary(
    made, tmp_path_factory, capsys, tiny_loads, hit
):
    base = tmp_path_factory.mktemp("resume")
    folder = copy(made, "run", base)
    damage(folder, made / "other", *hit)
    code, err = resume(folder, made / "data.jsonl", capsys)
    if code == 0:
        assert records.read_records(folder, FAITHFULNESS) == records.read_records(made / "run", FAITHFULNESS), hit
        assert (folder / records.SUMMARY).read_text() == (made / "run" / records.SUMMARY).read_text(), hit
    else:
        assert refused(code, err), (hit, err)


@FEW
@given(hit=damages(["per_prompt.csv", "pooled.csv", "prompts.jsonl", "atlas.json"]))
def test_atlas_load_of_a_damaged_folder_is_a_clear_refusal_or_the_undamaged_answer(made, tmp_path_factory, capsys, hit):
    base = tmp_path_factory.mktemp("atlas")
    whole = call(["atlas", "--load", made / "atlas", "--top", "3"], capsys)
    folder = copy(made, "atlas", base)
    damage(folder, made / "other_atlas", *hit)
    code, out, err = call(["atlas", "--load", folder, "--top", "3", "--out", base / "copy"], capsys)
    if code == 0:
        assert out.replace(str(folder), str(made / "atlas")).split(f"wrote {base / 'copy'}")[0] == whole[1], hit
        assert atlas.load(base / "copy").pooled.equals(atlas.load(made / "atlas").pooled)
    else:
        assert refused(code, err) and not (base / "copy").exists(), (hit, err)


# -- atlas files, bounds -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "edit", "named"),
    [
        ("pooled.csv", lambda t: t[: len(t) // 2], "pooled.csv"),
        (
            "pooled.csv",
            lambda t: "\n".join(",".join(c for c in line.split(",")[:8]) for line in t.splitlines()) + "\n",
            "_low",
        ),
        ("atlas.json", lambda t: json.dumps([json.loads(t)]), "JSON list"),
        ("atlas.json", lambda t: json.dumps(json.loads(t) | {"confidence": "high"}), "confidence"),
    ],
)
def test_atlas_load_refuses_a_cut_or_edited_folder_and_writes_nothing(made, tmp_path, capsys, name, edit, named):
    folder = copy(made, "atlas", tmp_path)
    (folder / name).write_text(edit((folder / name).read_text()))
    code, out, err = call(["atlas", "--load", folder, "--out", tmp_path / "copy"], capsys)
    assert refused(code, err) and named in err and out == ""
    assert not (tmp_path / "copy").exists()
    with pytest.raises(InputError):
        atlas.load(folder)


def test_atlas_load_with_out_writes_the_copy(made, tmp_path, capsys):
    code, out, _ = call(["atlas", "--load", made / "atlas", "--out", tmp_path / "copy"], capsys)
    assert code == 0 and f"wrote {tmp_path / 'copy'}" in out
    again, first = atlas.load(tmp_path / "copy"), atlas.load(made / "atlas")
    assert again.pooled.equals(first.pooled) and again.prompts == first.prompts and again.manifest == first.manifest


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["atlas", "--load", "{atlas}", "--top", "-1"], "--top"),
        (["atlas", "--load", "{atlas}", "--top", "0"], "--top"),
        (["atlas", "--jsonl", "{data}", "--bootstrap", "100000000"], "--bootstrap"),
        (["atlas", "--jsonl", "{data}", "--bootstrap", "0"], "--bootstrap"),
        (["sinks", "--text", "hello there world", "--factor", "1e308"], "--factor"),
        (["sinks", "--text", "hello there world", "--factor=-1e5"], "--factor"),
    ],
)
def test_out_of_range_numbers_are_refused_before_any_model_loads(made, capsys, monkeypatch, argv, named):
    for module in (sinks_cli, atlas_cli):
        monkeypatch.setattr(module, "load", lambda _args: pytest.fail("the model loaded for a bad number"))
    code, out, err = call([a.format(atlas=made / "atlas", data=made / "data.jsonl") for a in argv], capsys)
    assert refused(code, err) and named in err and out == ""  # nothing printed: refused before the atlas is shown


def test_a_bootstrap_too_large_for_memory_is_refused_before_the_forward_pass(made, capsys, monkeypatch):
    monkeypatch.setattr(atlas_cli, "load", lambda _args: make_tiny("llama"))
    monkeypatch.setattr(atlas, "BOOTSTRAP_BYTES", 1024)
    monkeypatch.setattr(atlas, "iter_prompt_stats", lambda *a, **k: pytest.fail("a forward pass ran"))
    code, _, err = call(["atlas", "--jsonl", made / "data.jsonl", "--bootstrap", "1000"], capsys)
    assert refused(code, err) and "give at most" in err


def test_the_api_refuses_what_the_cli_refuses():
    bundle = make_tiny("llama")
    with pytest.raises(InputError, match="bootstrap"):
        atlas.run(bundle, TEXTS, bootstrap=0)
    with pytest.raises(InputError, match="bootstrap"):
        atlas.run(bundle, TEXTS, bootstrap=atlas.MAX_BOOTSTRAP + 1)
    from cwviz.analyses.sink_interventions import check_factor

    with pytest.raises(InputError, match="λ"):
        check_factor(1e308)


def test_an_mmlu_line_whose_subject_is_a_number_is_named(tmp_path, capsys, tiny_loads):
    line = {"question": "2+2?", "choices": ["3", "4"], "answer": 1, "subject": 7}
    data = tmp_path / "mmlu.jsonl"
    data.write_text(json.dumps(line) + "\n")
    code, _, err = call(["faithfulness", "--task", "mmlu", "--jsonl", data], capsys)
    assert refused(code, err) and "'subject'" in err and "line 1" in err


# -- text and input_ids ------------------------------------------------------------------------------------
def test_text_with_the_ids_of_another_text_is_refused():
    bundle = make_tiny("llama")
    ids = bundle.tokenizer("The cat", add_special_tokens=True)["input_ids"]
    assert cwviz.analyze(bundle, "The cat", input_ids=ids).text == "The cat"
    with pytest.raises(CwvizError, match="input_ids"):
        cwviz.analyze(bundle, "The cat", input_ids=bundle.tokenizer("A dog ran", add_special_tokens=True)["input_ids"])
    alone = cwviz.analyze(bundle, input_ids=ids)  # ids alone: the text is their decoding, and it agrees with them
    assert cwviz.analyze(bundle, alone.text, input_ids=ids).tokens == alone.tokens


# -- writes are whole or absent ----------------------------------------------------------------------------
def test_analyze_json_onto_a_full_disk_leaves_no_partial_file(tmp_path, capsys, monkeypatch):
    from cwviz.cli import analyze as analyze_cli
    from cwviz.core.util import texts

    monkeypatch.setattr(analyze_cli, "load", lambda _args: make_tiny("llama"))
    real = texts.os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(texts.os, "fsync", full)
    target = tmp_path / "out.json"
    code, _, err = call(["analyze", "--text", "hello there", "--json", target], capsys)
    monkeypatch.setattr(texts.os, "fsync", real)
    assert refused(code, err) and "No space left" in err
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


def test_atlas_records_of_another_grid_are_refused_on_resume(made, tmp_path, capsys, tiny_loads):
    folder = copy(made, "atlas", tmp_path)
    edit_record(
        folder, 1, lambda r: r.update({k: r[k][:-1] for k in ("layer", "head", *atlas.ATLAS_METRICS)}), checksum=True
    )
    code, _, err = call(
        ["atlas", "--jsonl", made / "data.jsonl", "--bootstrap", "20", "--results", folder, "--resume"], capsys
    )
    assert refused(code, err) and "grids" in err


def test_records_of_two_rank_scopes_are_refused_and_a_missing_scope_reads_as_query(made, tmp_path):
    """The query scope is left out of the fingerprint (older folders resume), so a record whose ``rank_scope`` was lost
    among token-scope records must be refused by the scope itself; alone, a missing scope is the query scope. The
    records are made as cwviz made them before scopes (and before checksums: version 1)."""
    folder = copy(made, "run", tmp_path)
    path = folder / "records-00000.jsonl"
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["rank_scope"] for r in written] == ["query"] * len(written)
    for record in written:
        del record["rank_scope"], record[records.CHECKSUM]
        record["version"] = 1
    path.write_text("".join(json.dumps(r) + "\n" for r in written))

    def content(made: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in (records.CHECKSUM, "version")} for r in made]

    assert content(records.read_records(folder, FAITHFULNESS)) == content(
        records.read_records(made / "run", FAITHFULNESS)
    )
    written[0]["rank_scope"] = "token"
    path.write_text("".join(json.dumps(r) + "\n" for r in written))
    with pytest.raises(InputError, match="different rank scopes"):
        records.read_records(folder, FAITHFULNESS)
