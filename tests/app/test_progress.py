"""Progress callbacks: every long step reports (done, total) from 1 to total, and results do not change.

The dashboard's bar (:func:`cwviz.app.services.progress_bar`) is checked against a stand-in for ``st``:
quick steps draw nothing, slow ones say "label: k of n layers", and the bar is removed at the end, also
when the step raises.
"""

from __future__ import annotations

import pandas as pd
import pytest

import cwviz
from cwviz.analyses import sink_interventions, sinks, tables
from cwviz.app import services
from cwviz.core.loading.generate import greedy_continuation
from cwviz.core.util.progress import cli_bar, counted, items_left_text
from tests.helpers import make_tiny

TEXT = "the quick brown fox jumps"


class Calls(list):
    def __call__(self, done: int, total: int) -> None:
        self.append((done, total))


def _assert_counts(calls: Calls, total: int) -> None:
    assert calls, "progress was never reported"
    assert all(t == total for _, t in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == total and done[0] >= 1


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def case(request):
    bundle = make_tiny(request.param)
    return bundle, cwviz.analyze(bundle, TEXT)


def test_analyze_reports_every_layer_and_gives_the_same_analysis(case):
    bundle, plain = case
    calls = Calls()
    analysis = cwviz.analyze(bundle, TEXT, progress=calls)
    assert calls == [(k, bundle.info.layers) for k in range(1, bundle.info.layers + 1)]
    for layer in range(bundle.info.layers):
        assert (analysis.contributions(layer) == plain.contributions(layer)).all()


@pytest.mark.parametrize(
    "step, total",
    [
        (lambda a, p: tables.head_summary(a, progress=p), "layers"),
        (lambda a, p: tables.top_keys_across_layers(a, 3, None, "inter", 2, progress=p), "layers"),
        (lambda a, p: sinks.sink_table(a, 0, progress=p), "layers"),
        (lambda a, p: sink_interventions.layerwise_removal(a, 0, 0.0, progress=p), "layers"),
        (lambda a, p: sink_interventions.intervene_on_sink(a, 0, 0.0, progress=p).table, "2 layers"),
    ],
    ids=["head_summary", "top_keys", "sink_table", "layerwise", "intervene"],
)
def test_table_steps_report_progress_and_keep_their_results(case, step, total):
    _, analysis = case
    calls = Calls()
    with_progress = step(analysis, calls)
    expected = analysis.num_layers * (2 if total == "2 layers" else 1)
    _assert_counts(calls, expected)
    pd.testing.assert_frame_equal(with_progress, step(analysis, None))


def test_generation_reports_each_token():
    bundle = make_tiny("llama")
    calls = Calls()
    ids = greedy_continuation(bundle, [1, 2, 3], 4, progress=calls)
    assert ids == greedy_continuation(bundle, [1, 2, 3], 4)
    _assert_counts(calls, 4)


def test_counted_and_the_cli_bar():
    calls = Calls()
    assert list(counted("abc", 3, calls)) == ["a", "b", "c"]
    assert calls == [(1, 3), (2, 3), (3, 3)]
    with cli_bar("x", enabled=False) as bar:
        assert bar is None
    with cli_bar("x") as bar:
        bar(1, 2)
        bar(2, 2)


class FakeSlot:
    def __init__(self, log):
        self.log = log

    def progress(self, value, text):
        self.log.append(("progress", round(value, 3), text))

    def empty(self):
        self.log.append(("empty",))


class FakeSt:
    def __init__(self):
        self.log = []

    def empty(self):
        self.log.append(("slot",))
        return FakeSlot(self.log)


def test_the_dashboard_bar_shows_layers_done_and_is_removed(monkeypatch):
    fake = FakeSt()
    monkeypatch.setattr(services, "st", fake)
    monkeypatch.setattr(services, "PROGRESS_EVERY_S", 0.0)
    with services.progress_bar("Summarising") as progress:  # quick: nothing drawn
        progress(1, 2)
        progress(2, 2)
    assert fake.log == [("slot",)]  # an empty placeholder, made before the step; nothing drawn in it

    fake.log.clear()
    monkeypatch.setattr(services, "PROGRESS_AFTER_S", 0.0)
    with services.progress_bar("Summarising") as progress:
        progress(1, 4)
        progress(4, 4)
    assert fake.log == [
        ("slot",),
        ("progress", 0.25, "Summarising: 1 of 4 layers"),
        ("progress", 1.0, "Summarising: 4 of 4 layers"),
        ("empty",),
    ]

    fake.log.clear()
    with pytest.raises(RuntimeError), services.progress_bar("Analysing", "tokens") as progress:
        progress(1, 3)
        raise RuntimeError("the step failed")
    assert fake.log[-1] == ("empty",) and fake.log[1][2] == "Analysing: 1 of 3 tokens"


def test_the_binned_heatmap_reports_its_row_blocks_and_keeps_its_cells(case, monkeypatch):
    """The binned view reads the whole layer (2-3 s at 8k tokens on a CPU), so it reports the blocks it has
    reduced; the cells are the same with and without a callback."""
    from cwviz.core.method import row_block_sizes

    _, analysis = case
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", 2)  # one query row a block
    calls = Calls()
    cells = tables.heatmap_cells(
        analysis, 0, None, "contribution_inter", "inter", 2, "binned", max_cells=6, progress=calls
    )
    assert cells.binned
    _assert_counts(calls, analysis.num_tokens)
    pd.testing.assert_frame_equal(
        cells.frame,
        tables.heatmap_cells(analysis, 0, None, "contribution_inter", "inter", 2, "binned", max_cells=6).frame,
    )


def test_the_estimate_of_a_run_over_items_comes_from_the_items_timed_after_the_first():
    # no guess before one is timed
    assert items_left_text(0, 5, []) == "item 1 of 5 (an estimate follows the first item)"
    assert items_left_text(1, 5, [200.0]) == "item 2 of 5, about 13 min left"  # one timed: 4 x 200 s
    # The first item's warm-up (200 s) leaves the estimate once another is timed: 3 left x 60 s.
    assert items_left_text(2, 5, [200.0, 60.0]) == "item 3 of 5, about 3 min left"
    assert items_left_text(4, 5, [200.0, 20.0, 22.0, 21.0]) == "item 5 of 5, about 20 s left"
    assert items_left_text(4, 5, [1.0, 0.1, 0.1, 0.1], unit="prompt") == "prompt 5 of 5, about 5 s left"
    assert items_left_text(5, 5, [1.0] * 5, unit="example") == "5 of 5 examples done"


def test_the_bar_of_a_run_over_items_shows_at_once_and_counts_resumed_items(monkeypatch):
    fake = FakeSt()
    monkeypatch.setattr(services, "st", fake)
    with services.item_bar("Claims on embedded", 4, done=1) as progress:  # one item kept from a stopped run
        assert fake.log[-1] == (
            "progress",
            0.25,
            "Claims on embedded: item 2 of 4 (an estimate follows the first item)",
        )
        progress(1, 3)  # the runner counts this run's items
        assert fake.log[-1][:2] == ("progress", 0.5) and fake.log[-1][2].startswith(
            "Claims on embedded: item 3 of 4, about "
        )
    assert fake.log[-1] == ("empty",)

    fake.log.clear()
    with services.item_bar("Atlas on embedded", 2, unit="prompt", per_item=10) as progress:  # steps of every prompt
        progress(10, 20)
        progress(20, 20)
    texts = [entry[2] for entry in fake.log if entry[0] == "progress"]
    assert (
        texts[1].startswith("Atlas on embedded: prompt 2 of 2, about")
        and texts[-1] == "Atlas on embedded: 2 of 2 prompts done"
    )
