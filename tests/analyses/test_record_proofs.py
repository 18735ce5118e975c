"""Records that prove themselves (issue 48, the records half): every record carries a checksum of its content and is
checked on read (types, ranges, the identities between its fields), so a record edited by hand is refused naming its
file and line, never averaged; a summary's n counts the values in its mean; a refused resume names each setting
that differs; a folder of another command is named as such and kept; "raised PPL" counts changes above a tolerance;
a negative atlas seed is refused before any forward pass.

The real folders are made once per module with a tiny random model; each test edits a copy.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cwviz import cli
from cwviz.analyses import atlas, faithfulness_summary, records, sink_interventions
from cwviz.analyses.codecs.sweeps import ATLAS, FAITHFULNESS, SINKS
from cwviz.cli import atlas as atlas_cli
from cwviz.cli import faithfulness as faith_cli
from cwviz.cli import sinks as sinks_cli
from cwviz.core.util.errors import CwvizError, InputError
from tests.helpers import call, copy, edit_record, make_tiny, refused, write_jsonl

TEXTS = ["The quick brown fox jumps over the dog.", "A second, rather longer example sentence here."]
FAITH = ["--rates", "10,50", "--measures", "raw,random"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``run``: faithfulness (2 examples) and sinks (``run/sinks``); ``atlas``: 2 prompts."""
    root = tmp_path_factory.mktemp("made")
    with pytest.MonkeyPatch.context() as patch:
        for module in (faith_cli, sinks_cli, atlas_cli):
            patch.setattr(module, "load", lambda _args: make_tiny("llama"))
        data = write_jsonl(root / "data.jsonl", TEXTS)
        assert cli.main(["faithfulness", "--jsonl", str(data), *FAITH, "--results", str(root / "run")]) == 0
        assert cli.main(["sinks", "--jsonl", str(data), "--results", str(root / "run")]) == 0
        assert cli.main(["atlas", "--jsonl", str(data), "--bootstrap", "20", "--results", str(root / "atlas")]) == 0
    return root


@pytest.fixture
def tiny_loads(monkeypatch):
    for module in (faith_cli, sinks_cli, atlas_cli):
        monkeypatch.setattr(module, "load", lambda _args: make_tiny("llama"))


def records_file(folder: Path) -> Path:
    (path,) = sorted(folder.glob(records.RECORD_GLOB))
    return path


def resume(folder: Path, data: Path, capsys, *options: str) -> tuple[int, str]:
    code, _, err = call(["faithfulness", "--jsonl", data, *(options or FAITH), "--results", folder, "--resume"], capsys)
    return code, err


# -- checksums ---------------------------------------------------------------------------------------------
def test_every_record_written_carries_the_checksum_of_its_content(made):
    for line in records_file(made / "run").read_text().splitlines():
        record = json.loads(line)
        assert record["version"] == records.VERSION and record[records.CHECKSUM] == records.record_checksum(record)


def test_a_consistent_edit_is_refused_by_the_checksum_on_resume_and_in_the_report(made, tmp_path, capsys, tiny_loads):
    """ΔPPL and the masked PPL moved together, so every identity still holds: only the checksum can tell."""
    folder = copy(made, "run", tmp_path)

    def consistent(record):
        run = record["runs"][0]
        run["ppl_masked"] += 4621.3
        run["delta_ppl"] = run["ppl_masked"] - record["ppl_clean"]

    edit_record(folder, 0, consistent)
    code, err = resume(folder, made / "data.jsonl", capsys)
    assert refused(code, err) and f"line 1 of {records_file(folder)}" in err and "checksum" in err
    code, _, err = call(["report", "--results", folder, "--out", tmp_path / "r.html"], capsys)
    assert refused(code, err) and "checksum" in err


def test_records_written_before_checksums_are_still_read(made, tmp_path):
    folder = copy(made, "run", tmp_path)
    path = records_file(folder)
    old = [
        {k: v for k, v in json.loads(line).items() if k != records.CHECKSUM} | {"version": 1}
        for line in path.read_text().splitlines()
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    assert [r["example"] for r in records.read_records(folder, FAITHFULNESS)] == [0, 1]
    edit_record(folder, 0, lambda r: r.pop("ppl_clean"))  # a field check still applies to them
    with pytest.raises(InputError, match="ppl_clean"):
        records.read_records(folder, FAITHFULNESS)


# -- field checks and identities (a forged checksum: the checks beneath it) --------------------------------
def test_a_delta_ppl_that_contradicts_the_perplexities_is_refused_naming_file_and_line(
    made, tmp_path, capsys, tiny_loads
):
    folder = copy(made, "run", tmp_path)
    edit_record(folder, 1, lambda r: r["runs"][0].update(delta_ppl=r["runs"][0]["delta_ppl"] * 10 + 1), checksum=True)
    code, err = resume(folder, made / "data.jsonl", capsys)
    assert refused(code, err) and f"line 2 of {records_file(folder)}" in err and "'delta_ppl'" in err
    code, _, err = call(["report", "--results", folder, "--out", tmp_path / "r.html"], capsys)
    assert refused(code, err) and "'delta_ppl'" in err


def test_an_atlas_share_above_one_is_refused_not_pooled(made, tmp_path, capsys, tiny_loads):
    folder = copy(made, "atlas", tmp_path)
    edit_record(folder, 0, lambda r: r["sink_attention"].__setitem__(0, 5.12), checksum=True)
    with pytest.raises(CwvizError, match=r"line 1 of .*'sink_attention' must be a share from 0 to 1.*5\.12"):
        records.read_records(folder, ATLAS)
    code, _, err = call(
        ["atlas", "--jsonl", made / "data.jsonl", "--bootstrap", "20", "--results", folder, "--resume"], capsys
    )
    assert refused(code, err) and "sink_attention" in err


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda r: r.update(tokens=-3), "tokens"),
        (lambda r: r.update(ppl_clean=math.inf), "ppl_clean"),
        (lambda r: r["runs"][0].update(rate=250.0), "rate"),
        (lambda r: r["runs"][0].update(ppl_masked=-1.0), "ppl_masked"),
        (lambda r: r["runs"][0].update(measure="bogus"), "measure"),
    ],
)
def test_a_faithfulness_record_out_of_range_is_refused(made, tmp_path, change, named):
    folder = copy(made, "run", tmp_path)
    edit_record(folder, 0, change, checksum=True)
    with pytest.raises(InputError, match=rf"line 1 of .*{named}"):
        records.read_records(folder, FAITHFULNESS)


def test_a_sinks_record_out_of_range_is_refused(made, tmp_path):
    folder = copy(made, "run/sinks", tmp_path)
    edit_record(folder, 0, lambda r: r["table"]["sink_ratio"].__setitem__(0, 1.7), checksum=True)
    with pytest.raises(InputError, match=r"line 1 of .*'sink_ratio' must be a share"):
        records.read_records(folder, SINKS)


# -- a summary's n -----------------------------------------------------------------------------------------
def test_a_summary_n_counts_the_values_in_its_mean():
    """One example's ΔPPL is NaN (its masked run overflowed): the mean is of three, and n says three."""
    table = pd.DataFrame(
        {
            "measure": "raw",
            "curve": "comprehensiveness",
            "rate": 10.0,
            "delta_ppl": [1.0, 2.0, math.nan, 3.0],
            "example": range(4),
        }
    )
    (row,) = faithfulness_summary.summarize(table, resamples=50).itertuples()
    assert row.n == 3 and row.delta_ppl == pytest.approx(2.0)
    assert math.isfinite(row.ci_low) and math.isfinite(row.ci_high)


# -- "raised PPL" ------------------------------------------------------------------------------------------
def test_raised_ppl_counts_only_changes_above_the_tolerance():
    clean = np.array([513.5, 20.0])
    assert sink_interventions.raised_ppl(clean + 6.7e-5, clean) == 0  # λ = 1: float noise
    assert sink_interventions.raised_ppl(clean * (1 + 2 * sink_interventions.PPL_TOLERANCE), clean) == 2


def test_sinks_factor_one_raises_no_prompt_and_states_the_tolerance(made, tmp_path, capsys, tiny_loads):
    code, out, _ = call(["sinks", "--jsonl", made / "data.jsonl", "--factor", "1"], capsys)
    assert code == 0
    assert f"raised PPL by more than {sink_interventions.PPL_TOLERANCE:.1%} of the clean PPL on 0 of 2 prompt(s)" in out


# -- the seed ----------------------------------------------------------------------------------------------
def test_a_negative_atlas_seed_is_refused_before_the_model_loads(made, capsys, monkeypatch):
    monkeypatch.setattr(atlas_cli, "load", lambda _args: pytest.fail("the model loaded for a negative seed"))
    code, _, err = call(["atlas", "--gsm8k", "--n", "2", "--seed", "-1"], capsys)
    assert refused(code, err) and "--seed" in err and "non-negative" in err
    with pytest.raises(CwvizError, match="non-negative"):
        atlas.pool(ATLAS.decode(records.read_records(made / "atlas", ATLAS)), bootstrap=10, seed=-1)


# -- refusals that name what is wrong ----------------------------------------------------------------------
def test_a_refused_resume_names_each_setting_that_differs_old_and_new(made, tmp_path, capsys, tiny_loads):
    folder = copy(made, "run", tmp_path)
    code, err = resume(
        folder, made / "data.jsonl", capsys, "--rates", "10", "--measures", "raw,random", "--max-tokens", "64"
    )
    assert refused(code, err)
    assert "protocol.rates: [10.0, 50.0] -> [10.0]" in err and "protocol.max_tokens: 256 -> 64" in err, err
    assert "protocol.measures" not in err  # only what differs


@pytest.mark.parametrize(
    "argv, other",
    [
        (["faithfulness", "--jsonl", "{data}", *FAITH, "--results", "{atlas}", "--resume"], "atlas"),
        (["faithfulness", "--jsonl", "{data}", *FAITH, "--results", "{run}/sinks", "--resume"], "sinks"),
        (["report", "--results", "{atlas}", "--out", "{tmp}/r.html"], "atlas"),
    ],
)
def test_a_folder_of_another_command_is_named_as_such_and_kept(made, tmp_path, capsys, tiny_loads, argv, other):
    run, folder = copy(made, "run", tmp_path), copy(made, "atlas", tmp_path)
    manifests = {p: p.read_bytes() for p in (folder / records.MANIFEST, run / "sinks" / records.MANIFEST)}
    values = {"data": made / "data.jsonl", "atlas": folder, "run": run, "tmp": tmp_path}
    code, _, err = call([a.format(**values) for a in argv], capsys)
    assert refused(code, err) and f"holds the results of `cwviz {other}`" in err and "delete" not in err
    assert all(p.read_bytes() == text for p, text in manifests.items())


def test_a_records_file_replaced_by_a_folder_is_named_as_a_folder(made, tmp_path, capsys, tiny_loads):
    folder = copy(made, "run", tmp_path)
    path = records_file(folder)
    path.unlink()
    path.mkdir()
    code, err = resume(folder, made / "data.jsonl", capsys)
    assert refused(code, err) and "is not a records file but a folder" in err and "line" not in err


# -- the property: any single-field edit is refused --------------------------------------------------------
def leaves(value, path=()):
    """Every (path, value) of a JSON value's scalars and empty containers."""
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in leaves(item, (*path, key))]
    if isinstance(value, list) and value:
        return [leaf for index, item in enumerate(value) for leaf in leaves(item, (*path, index))]
    return [(path, value)]


def same(a, b) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


NEW_VALUES = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
)


@pytest.mark.parametrize("name, codec", [("run", FAITHFULNESS), ("atlas", ATLAS)])
def test_any_single_field_edit_is_refused_never_used(made, tmp_path_factory, name, codec):
    """A random field of a real record (the checksum aside) set to a random other value: reading the folder refuses it,
    naming the file and the line; the edited value never reaches a summary."""
    source = made / name
    original = json.loads(records_file(source).read_text().splitlines()[0])
    fields = [leaf for leaf in leaves(original) if leaf[0][0] != records.CHECKSUM]

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.sampled_from(fields), NEW_VALUES)
    def check(field, value):
        path, old = field
        if same(old, value):
            return
        folder = Path(shutil.copytree(source, tmp_path_factory.mktemp("edit") / name))

        def change(record):
            target = record
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        edit_record(folder, 0, change)
        with pytest.raises(InputError, match=rf"line 1 of {records_file(folder)}"):
            records.read_records(folder, codec)

    check()
