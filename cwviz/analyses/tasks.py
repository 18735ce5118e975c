"""Downstream tasks under masking: multiple-choice accuracy, clean and with each measure's masks
(docs/METHOD.md section 3, the paper's MMLU, BoolQ and Winogrande evaluation).

Each item has two or more choices; each choice is a context and a continuation (lm-evaluation-harness's
zero-shot templates, :data:`TEMPLATES`). A choice is scored by the summed log-likelihood of its
continuation's tokens given its context; the item is answered by the best-scoring choice (the harness's
``acc``; ties go to the first choice). Under masking, every choice's sequence (context + continuation)
gets its own clean pass, its own rankings and its own masked runs, exactly as a text example does
(:func:`cwviz.analyses.faithfulness.masked_logprobs`), and is scored again under each
(measure, curve, rate); rate 0 is the clean pass itself, so accuracy with nothing masked is the clean
accuracy exactly. ΔPPL beside the accuracy is the perplexity of the correct choice's whole sequence.

Tokens: as the harness does, the context's trailing spaces move to the continuation, the sequence
context + continuation is tokenised whole (with the tokenizer's special tokens), and the continuation is
what follows the context's own tokens. A sequence longer than the protocol's token cap loses tokens
from the left (the continuation is kept); an item whose continuation does not fit is skipped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.loading.inputs import check_length
from ..core.loading.models import Bundle
from ..core.method.analysis import analyze
from ..core.util.errors import InputError
from ..core.util.texts import check_text
from . import faithfulness
from .codecs.sweeps import FAITHFULNESS
from .faithfulness import EXAMPLE_COLUMNS, Protocol, check_causal, masked_layers, masked_logprobs, runs_table
from .schema import TASKS

log = logging.getLogger(__name__)

#: The prompt template each multiple-choice task (:data:`~cwviz.analyses.schema.TASKS`) uses (lm-evaluation-harness's
#: zero-shot ones).
TEMPLATES: dict[str, str] = {
    "mmlu": "[The following are multiple choice questions (with answers) about {subject}.\\n\\n]{question}\\n"
    "A. {choices[0]}\\nB. {choices[1]}\\n...\\nAnswer: -> choices ' A', ' B', ...",
    "boolq": "{passage}\\nQuestion: {question}?\\nAnswer: -> choices ' no', ' yes'",
    "winogrande": "{sentence up to _}{option} -> continuation ' {sentence after _}' (partial evaluation)",
}
#: Columns of a task item's per-example table: those of a text example and whether it was answered right.
TASK_COLUMNS = [*EXAMPLE_COLUMNS, "correct_clean", "correct_masked"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Item:
    """One multiple-choice item: choice k is ``contexts[k]`` followed by ``continuations[k]``."""

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    answer: int

    def __post_init__(self) -> None:
        if len(self.contexts) != len(self.continuations) or len(self.contexts) < 2:
            raise InputError(
                f"an item needs two or more choices, a context and a continuation each; got {len(self.contexts)} and "
                f"{len(self.continuations)}"
            )
        if (
            isinstance(self.answer, bool)
            or not isinstance(self.answer, int)
            or not 0 <= self.answer < len(self.contexts)
        ):
            raise InputError(f"an item's answer is a choice's index 0..{len(self.contexts) - 1}, not {self.answer!r}")

    @property
    def text(self) -> str:
        """The item as one string (what a sweep's record hashes to recognise it on resume)."""
        return json.dumps([self.contexts, self.continuations, self.answer], ensure_ascii=False)


# -- readers: the standard field layouts -------------------------------------------------------------
def _field(row: dict, name: str, types: type | tuple[type, ...], where: str):
    if name not in row:
        raise InputError(f"{where} has no field {name!r} (fields: {', '.join(map(repr, row)) or 'none'})")
    value = row[name]
    if not isinstance(value, types) or (types is not bool and isinstance(value, bool)):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise InputError(f"{where}: field {name!r} is a {type(value).__name__}, not a {names}")
    return value


def mmlu_item(row: dict, where: str) -> Item:
    """MMLU (``cais/mmlu``): ``question``, ``choices`` (a list of strings), ``answer`` (the index, or its letter),
    ``subject`` (optional: it names the description line)."""
    question = _field(row, "question", str, where)
    choices = _field(row, "choices", list, where)
    if len(choices) < 2 or len(choices) > len(LETTERS) or not all(isinstance(c, str) for c in choices):
        raise InputError(f"{where}: 'choices' must be a list of 2 to {len(LETTERS)} strings")
    answer = _field(row, "answer", (int, str), where)
    if isinstance(answer, str):
        if len(answer.strip()) != 1 or answer.strip().upper() not in LETTERS[: len(choices)]:
            raise InputError(f"{where}: 'answer' {answer!r} is not a choice's letter (A..{LETTERS[len(choices) - 1]})")
        answer = LETTERS.index(answer.strip().upper())
    if not 0 <= answer < len(choices):
        raise InputError(f"{where}: 'answer' {answer} is not a choice's index (0..{len(choices) - 1})")
    subject = _field(row, "subject", str, where) if row.get("subject") is not None else None
    head = (
        f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        if subject
        else ""
    )
    options = "".join(f"{LETTERS[k]}. {choice}\n" for k, choice in enumerate(choices))
    context = f"{head}{question.strip()}\n{options}Answer:"
    return Item((context,) * len(choices), tuple(f" {LETTERS[k]}" for k in range(len(choices))), answer)


def boolq_item(row: dict, where: str) -> Item:
    """BoolQ (``google/boolq``): ``passage``, ``question``, ``answer`` (true or false)."""
    passage = _field(row, "passage", str, where)
    question = _field(row, "question", str, where)
    answer = _field(row, "answer", bool, where)
    context = f"{passage}\nQuestion: {question}?\nAnswer:"
    return Item((context, context), (" no", " yes"), int(answer))


def winogrande_item(row: dict, where: str) -> Item:
    """Winogrande (``allenai/winogrande``): ``sentence`` with one ``_``, ``option1``, ``option2``, ``answer``
    ("1" or "2"). Partial evaluation: each option fills the blank in the context, and the same rest of
    the sentence is scored after it."""
    sentence = _field(row, "sentence", str, where)
    options = (_field(row, "option1", str, where), _field(row, "option2", str, where))
    answer = _field(row, "answer", (str, int), where)
    if str(answer).strip() not in ("1", "2"):
        hint = " (the test split is unlabelled; use the validation split)" if str(answer).strip() == "" else ""
        raise InputError(f'{where}: \'answer\' must be "1" or "2", not {answer!r}{hint}')
    if sentence.count("_") != 1:
        raise InputError(f"{where}: 'sentence' must hold exactly one '_' (the blank), not {sentence.count('_')}")
    blank = sentence.index("_")
    rest = " " + sentence[blank + 1 :].strip()
    return Item(tuple(sentence[:blank] + option for option in options), (rest, rest), int(str(answer).strip()) - 1)


READERS: dict[str, Callable[[dict, str], Item]] = {
    "mmlu": mmlu_item,
    "boolq": boolq_item,
    "winogrande": winogrande_item,
}


def item_of(task: str, row: object, where: str) -> Item:
    """One item of ``task`` from a decoded record; InputError naming ``where`` (the file and line) otherwise."""
    if task not in READERS:
        raise InputError(f"unknown task {task!r}; choose from: {', '.join(TASKS)}")
    if not isinstance(row, dict):
        raise InputError(f"{where} is a JSON {type(row).__name__}, not an object with the {task} fields")
    return READERS[task](row, where)


def read_items(path: str | PathLike, task: str, n: int | None = None) -> list[Item]:
    """The first ``n`` items of a JSONL file in ``task``'s field layout; a malformed line is named by number."""
    from ..core.util.texts import iter_jsonl

    items = [item_of(task, row, f"line {line} of {path}") for line, row in iter_jsonl(path, n)]
    if not items:
        raise InputError(f"{Path(path)} holds no {task} items (every line is blank)")
    return items


def dataset_items(task: str, name: str, split: str = "validation", n: int | None = None) -> list[Item]:
    """Items of ``task`` from a Hugging Face dataset ``NAME`` or ``NAME:CONFIG`` (needs ``datasets`` and network)."""
    from .examples import dataset_rows

    items = [item_of(task, row, f"row {index} of {name}[{split}]") for index, row in dataset_rows(name, split, n)]
    if not items:
        raise InputError(f"the Hugging Face dataset {name!r} (split {split!r}) has no rows")
    return items


# -- scoring -------------------------------------------------------------------------------------------
def choice_ids(bundle: Bundle, context: str, continuation: str, max_tokens: int) -> tuple[list[int], int] | None:
    """Token ids of one choice and where its continuation starts, or None when the continuation does not
    fit in ``max_tokens`` tokens (with a token of context before it)."""
    check_text(context + continuation, what="the item")
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = list(bundle.tokenizer(context + continuation, add_special_tokens=True)["input_ids"])
    start = len(bundle.tokenizer(context, add_special_tokens=True)["input_ids"])
    if start >= len(whole) or start < 1:
        raise InputError(
            f"the continuation {continuation!r} gives no tokens of its own after its context; check the item"
        )
    cut = max(0, len(whole) - max_tokens)
    if start - cut < 1:
        return None
    return check_length(bundle, whole[cut:]), start - cut


def run_item(bundle: Bundle, item: Item, protocol: Protocol = Protocol(), example: int = 0) -> pd.DataFrame | None:
    """Every masked run of one item: :data:`TASK_COLUMNS`, one row per (measure, curve, rate, draw); None when a
    choice does not fit in the token cap.

    ``ppl_*`` and ``tokens`` are those of the correct choice's sequence; ``correct_*`` say whether the
    best-scoring choice (summed log-likelihood of its continuation) is the answer.
    """
    check_causal(bundle)
    runs = protocol.runs()
    scores = np.zeros((len(item.contexts), len(runs) + 1))  # (choice, clean + runs)
    for choice, (context, continuation) in enumerate(zip(item.contexts, item.continuations)):
        fitted = choice_ids(bundle, context, continuation, protocol.max_tokens)
        if fitted is None:
            return None
        ids, start = fitted
        analysis = analyze(bundle, input_ids=ids)
        logprobs = masked_logprobs(bundle, analysis, protocol, example)
        clean = analysis.next_token_logprobs
        # logprobs[t] is log p(token t+1 | ..t): the continuation's tokens start..T-1 are entries start-1..T-2
        scores[choice] = [clean[start - 1 :].sum(dtype=np.float64)] + [
            logprobs[run][start - 1 :].sum(dtype=np.float64) for run in runs
        ]
        if choice == item.answer:  # the perplexities are those of the correct choice's sequence
            table = runs_table(protocol, example, analysis, logprobs)
    correct = (scores.argmax(axis=0) == item.answer).astype(int)  # (clean + runs,); first best on ties
    return table.assign(correct_clean=correct[0], correct_masked=correct[1:])[TASK_COLUMNS]


def iter_items(
    bundle: Bundle,
    items: Iterable[Item],
    protocol: Protocol = Protocol(),
    *,
    start: int = 0,
    guard: Callable[[], AbstractContextManager] | None = None,
) -> Iterator[tuple[int, pd.DataFrame | None]]:
    """:func:`run_item` for each item in turn: yields ``(index, table)`` as
    :func:`cwviz.analyses.faithfulness.iter_examples` does (None: the item did not fit and is skipped)."""
    check_causal(bundle)
    masked_layers(bundle.info.layers, protocol.layer)
    for index, item in enumerate(items, start=start):
        with guard() if guard is not None else nullcontext():
            table = run_item(bundle, item, protocol, example=index)
        if table is None:
            log.warning("item %d does not fit in %d tokens; skipped", index, protocol.max_tokens)
        yield index, table


def item_text(example: str | Item) -> str:
    """What a faithfulness record hashes: the text, or a multiple-choice item as one string."""
    return example if isinstance(example, str) else example.text


def example_compute(
    bundle: Bundle, examples: Sequence, protocol: Protocol, task: str = "text", **options
) -> Callable[[int], dict]:
    """``compute(index)`` for :func:`cwviz.analyses.sweep.run`: example ``index`` of ``examples`` (texts, or a task's
    items) through the one example loop (:func:`cwviz.analyses.faithfulness.iter_examples`, :func:`iter_items`;
    ``options``: their ``guard`` and ``progress``), as a faithfulness record's payload."""
    loop = faithfulness.iter_examples if task == "text" else iter_items

    def compute(index: int) -> dict:
        ((_, table),) = loop(bundle, [examples[index]], protocol, start=index, **options)
        return FAITHFULNESS.encode(task, table, protocol.rank_scope)

    return compute
