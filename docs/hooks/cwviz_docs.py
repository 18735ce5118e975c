"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks:``): what the site shows that is not a file in docs/.

* The command-line reference is rendered from the argparse parsers themselves (:func:`cli_reference`, from
  :func:`cwviz.cli.parsers.build_parser`, which imports neither torch nor transformers), in place of the marker line
  of ``docs/cli.md``: a new command or option is in the site with no edit, so the reference cannot drift from the
  program.
* The screenshots are the repository's ``assets/*.png``, which the browser tests refresh
  (``CWVIZ_UPDATE_SCREENSHOT=1``); they are served from there as ``assets/...`` instead of copied into docs/.
* ``BENCHMARKS.md`` (the results page, at the top of the repository) and ``benchmarks/history.md`` (the dated log
  ``make bench`` appends to) are pages of their own.
* A list that follows a paragraph line directly (``Choices:`` then ``- ...``), as GitHub renders it, is a list on
  the site too: Python-Markdown needs a blank line before it (:func:`lists_after_paragraphs`). The pages keep
  reading as they do on GitHub, with no edit.
* ``docs/claims.md`` gets a nav entry under Analyses once it exists (strict builds refuse a nav entry to a
  missing page).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: The line of docs/cli.md that the generated reference replaces.
MARKER = "<!-- cli-reference -->"
#: Width of the usage lines in the reference (argparse would take the terminal's).
USAGE_WIDTH = 80
ROOT = Path(__file__).resolve().parent.parent.parent
#: Files outside docs/ that the site serves, relative to the repository root.
SCREENSHOTS = "assets"
TOP_PAGES = ("BENCHMARKS.md", "benchmarks/history.md")


def _cell(text: str) -> str:
    """``text`` safe inside one Markdown table cell: one line, no column bars, no HTML."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _invocation(action: argparse.Action) -> str:
    """How an option is written: ``--text TEXT``, ``-v, --verbose`` or a positional's name."""
    if not action.option_strings:
        return action.metavar or action.dest
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or (
        action.dest.upper() if action.choices is None else "{" + ",".join(map(str, action.choices)) + "}"
    )
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return ", ".join(f"{flag} {metavar}" for flag in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.required or action.default in (None, argparse.SUPPRESS, [], ""):
        return ""
    return f"`{action.default}`"


def _parser_section(name: str, parser: argparse.ArgumentParser, summary: str, level: str) -> list[str]:
    lines = [f"{level} `{name}`", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    if parser.description and parser.description != summary:
        lines += [parser.description, ""]
    formatter = parser.formatter_class(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    lines += ["```text", formatter.format_help().strip(), "```", ""]
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)
        ]
        if not actions:
            continue
        lines += [
            f"**{group.title[0].upper() + group.title[1:]}**",
            "",
            "| option | default | meaning |",
            "|---|---|---|",
        ]
        for action in actions:
            meaning = formatter._expand_help(action) if action.help else ""
            lines.append(f"| `{_cell(_invocation(action))}` | {_cell(_default(action))} | {_cell(meaning)} |")
        lines.append("")
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    return lines


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Every subcommand of ``parser``: name -> (its parser, its one-line help)."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
    return {name: (child, helps.get(name, "")) for name, child in sub.choices.items()}


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Markdown of ``cwviz``'s options and of each subcommand's usage and options, from the parsers themselves."""
    if parser is None:
        # This checkout's cwviz, not whichever one the interpreter that runs mkdocs has installed.
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from cwviz.cli.parsers import build_parser

        parser = build_parser()
    lines = _parser_section("cwviz", parser, "", "###")
    for name, (child, summary) in subcommands(parser).items():
        lines += _parser_section(f"cwviz {name}", child, summary, "###")
    return "\n".join(lines)


def lists_after_paragraphs(markdown: str) -> str:
    """``markdown`` with a blank line inserted where a list item follows a paragraph line (outside code fences)."""
    out: list[str] = []
    fence = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        previous = out[-1] if out else ""
        item = re.match(r"(- |\* |\d+\. )", line)
        if not fence and item and previous.strip() and not re.match(r"(\s|- |\* |\d+\. |\||#|>)", previous):
            out.append("")
        out.append(line)
    return "\n".join(out)


def on_config(config, **kwargs):
    claims = Path(config["docs_dir"]) / "claims.md"
    if claims.exists():
        for section in config["nav"] or []:
            if (
                isinstance(section, dict)
                and "Analyses" in section
                and {"Claims": "claims.md"} not in section["Analyses"]
            ):
                section["Analyses"].append({"Claims": "claims.md"})
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    for path in sorted((ROOT / SCREENSHOTS).glob("*.png")):
        files.append(File(f"{SCREENSHOTS}/{path.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    for name in TOP_PAGES:
        files.append(File(name, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, **kwargs):
    markdown = lists_after_paragraphs(markdown)
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return markdown
