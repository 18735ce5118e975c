"""``cwviz report``: one self-contained offline HTML file from a results folder (faithfulness records, a
multiple-choice task's accuracy, ``cwviz sinks --results``), and, in Chromium with the network cut, its figures
drawn; tiny random models only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cwviz import cli
from cwviz.cli import faithfulness as faithfulness_command
from cwviz.cli import sinks as sinks_command
from tests.helpers import BOOLQ, make_tiny

TEXTS = [f"Example {i}: the {'quick ' * (i % 3)}brown fox jumps over dog {i}." for i in range(4)]
CHROMIUM = "/usr/bin/chromium"


def make_results(tmp_path: Path, monkeypatch, task: str = "text", sinks: bool = True) -> Path:
    """A results folder: a small sweep (all the paper's measures, so the order check has every pair) and the sinks."""
    monkeypatch.setattr(faithfulness_command, "load", lambda _args: make_tiny("llama"))
    monkeypatch.setattr(sinks_command, "load", lambda _args: make_tiny("llama"))
    results = tmp_path / "results"
    rows = [{"text": t} for t in TEXTS] if task == "text" else BOOLQ
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    argv = [
        "faithfulness",
        "--task",
        task,
        "--jsonl",
        str(data),
        "--rates",
        "10,50",
        "--measures",
        "default",
        "--results",
        str(results),
    ]
    assert cli.main(argv) == 0
    if sinks:
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:2]), encoding="utf-8")
        assert cli.main(["sinks", "--jsonl", str(prompts), "--results", str(results)]) == 0
    return results


def write_report(results: Path, out: Path) -> str:
    assert cli.main(["report", "--results", str(results), "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_report_holds_curves_tables_order_check_sinks_and_how_to_rerun(tmp_path, monkeypatch, capsys):
    results = make_results(tmp_path, monkeypatch)
    page = write_report(results, tmp_path / "report.html")
    for anchor in ("run", "faithfulness", "sinks"):
        assert f'<section id="{anchor}">' in page
    assert page.count("<svg ") == 4  # two curves, the sinks' shares and anti-alignment map
    for figure in ("curve-comprehensiveness", "curve-sufficiency", "sinks-share", "sinks-cos"):
        assert f'data-figure="{figure}"' in page
    assert 'data-table="order"' in page and ">holds<" in page or ">fails<" in page
    assert 'data-table="delta-ppl-comprehensiveness"' in page and 'data-table="areas"' in page
    manifest = json.loads((results / "manifest.json").read_text())
    for value in (
        manifest["model"]["weights_sha256"],
        manifest["versions"]["torch"],
        manifest["versions"]["cwviz"],
        "tiny-llama",
    ):
        assert value in page
    assert "pip install cwviz==" in page and "cwviz faithfulness --task text --jsonl" in page
    # self-contained: no URL but the SVG namespaces, no script
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {
        "http://www.w3.org/2000/svg",
        "http://www.w3.org/1999/xlink",
    }
    assert "<script" not in page


def test_a_run_of_one_rate_reports_no_area_but_still_its_order_at_that_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(faithfulness_command, "load", lambda _args: make_tiny("llama"))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    results = tmp_path / "one-rate"
    argv = ["faithfulness", "--jsonl", str(data), "--rates", "50", "--measures", "default", "--results", str(results)]
    assert cli.main(argv) == 0
    page = write_report(results, tmp_path / "report.html")
    assert "n/a: this run has one removal rate" in page and 'data-table="areas"' not in page
    assert 'data-table="order"' in page and "<td>50%</td>" in page and "<td>area</td>" not in page


def test_report_of_a_task_adds_accuracy_and_of_sinks_alone(tmp_path, monkeypatch):
    results = make_results(tmp_path, monkeypatch, task="boolq", sinks=False)
    page = write_report(results, tmp_path / "report.html")
    assert '<section id="accuracy">' in page and 'data-figure="accuracy-comprehensiveness"' in page
    assert "Clean accuracy" in page and '<section id="sinks">' not in page
    sinks_only = tmp_path / "sinks-only"
    sinks_only.mkdir()
    monkeypatch.setattr(sinks_command, "load", lambda _args: make_tiny("llama"))
    assert cli.main(["sinks", "--text", TEXTS[0], "--results", str(sinks_only)]) == 0
    page = write_report(sinks_only, tmp_path / "sinks.html")
    assert '<section id="sinks">' in page and '<section id="faithfulness">' not in page


def test_report_escapes_what_it_shows_and_refuses_an_empty_folder(tmp_path, monkeypatch, capsys):
    results = make_results(tmp_path, monkeypatch, sinks=False)
    manifest = json.loads((results / "manifest.json").read_text())
    manifest["model"]["id"] = "<img src=x onerror=alert(1)>"
    (results / "manifest.json").write_text(json.dumps(manifest))
    page = write_report(results, tmp_path / "report.html")
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    empty = tmp_path / "empty"
    empty.mkdir()
    capsys.readouterr()
    assert cli.main(["report", "--results", str(empty), "--out", str(tmp_path / "x.html")]) == 2
    assert "holds no results" in capsys.readouterr().err


@pytest.mark.slow
def test_report_opens_in_chromium_offline_and_draws_its_figures(tmp_path, monkeypatch):
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    results = make_results(tmp_path, monkeypatch)
    out = tmp_path / "report.html"
    write_report(results, out)
    requests, errors = [], []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
        context.route(lambda url: not url.startswith("file:"), lambda route: route.abort())
        page = context.new_page()
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(out.as_uri())
        figures = page.locator("svg[data-figure]")
        assert figures.count() == 4
        for index in range(figures.count()):
            figure = figures.nth(index)
            figure.scroll_into_view_if_needed()
            box = figure.bounding_box()
            name = figure.get_attribute("data-figure")
            assert box is not None and box["height"] >= 150 and box["width"] >= 300, (name, box)
            # marks drawn: lines or rectangles with a size inside the plot
            marks = figure.locator("g.mark-line path, g.mark-rect path, g.mark-symbol path")
            assert marks.count() > 0, name
            drawn = [marks.nth(i).bounding_box() for i in range(min(marks.count(), 20))]
            assert any(b and (b["width"] > 2 or b["height"] > 2) for b in drawn), name
        assert page.locator("table[data-table=order] td.holds, table[data-table=order] td.fails").count() > 0
        shots = Path(__file__).resolve().parents[1] / "artifacts"
        shots.mkdir(exist_ok=True)
        page.screenshot(path=str(shots / "report.png"), full_page=True)
        browser.close()
    assert all(url.startswith("file:") for url in requests), requests
    assert not errors, errors


def test_the_reports_header_counts_the_examples_its_tables_measure(tmp_path, monkeypatch):
    """A one-token example is recorded but skipped: the header says how many were measured and skipped, and the
    measured count is the tables' n (they differed: 3 examples in the header, n = 2 in the tables)."""
    monkeypatch.setattr(faithfulness_command, "load", lambda _args: make_tiny("llama"))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in [TEXTS[0], "x", TEXTS[1]]), encoding="utf-8")
    results = tmp_path / "results"
    argv = ["faithfulness", "--jsonl", str(data), "--rates", "10,50", "--measures", "raw", "--results", str(results)]
    assert cli.main(argv) == 0
    page = write_report(results, tmp_path / "report.html")
    assert (
        "3 example(s): 2 measured (the tables&#x27; n), 1 skipped" in page
        or "3 example(s): 2 measured (the tables' n), 1 skipped" in page
    )
    assert "mean ΔPPL over 2 example(s)" in page
