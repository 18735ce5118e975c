"""The front door and the manual: the README stays short and starts with the two commands that are true, the site's
command-line reference covers every command and option of the program, and the dashboard guide has a section with
its screenshot for every page the app lists. (CI builds the whole site with ``mkdocs build --strict``.)"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
HOOKS = ROOT / "docs" / "hooks" / "cwviz_docs.py"


def _hooks():
    """The site's hook module (docs/hooks is not a package: MkDocs loads it by path, and so does this)."""
    spec = importlib.util.spec_from_file_location("cwviz_docs_hooks", HOOKS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), flags=re.M))


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the manual goes into docs/ (at most 200 here)"
    # A title, then at once the code block with the two commands: one sets up and runs, one tests.
    first = [line for line in lines[:8] if line.strip()]
    assert first[0].startswith("# ") and first[1].startswith("```")
    commands = [line.split("#")[0].split() for line in first[2:4]]
    assert commands == [["make", "run"], ["make", "test"]], first[:5]
    assert {"run", "test", "docs"} <= _make_targets(), (
        "the README's commands (and `make docs`) must be Makefile targets"
    )


def test_readme_links_lead_to_files_of_the_repository():
    """The README points into the docs by relative links, which GitHub and a checkout resolve: none may dangle."""
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    assert targets, "the README links into the docs"
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_cli_reference_covers_every_command_and_option():
    from cwviz.cli import build_parser

    hooks = _hooks()
    parser = build_parser()
    reference = hooks.cli_reference(parser)
    commands = hooks.subcommands(parser)
    assert commands, "the parser has no subcommands"
    for name, (child, _) in commands.items():
        section = reference.split(f"### `cwviz {name}`", 1)
        assert len(section) == 2, f"no section for `cwviz {name}`"
        body = section[1].split("\n### ", 1)[0]  # up to the next command's section
        # The first cell of each option's row: `--n N, --examples N` (a whole flag, so --n is not found in --no-ppl).
        cells = " ".join(line.split("|")[1] for line in body.splitlines() if line.startswith("| `"))
        for action in child._actions:
            if action.help is argparse.SUPPRESS:
                continue
            for flag in action.option_strings or [action.metavar or action.dest]:
                found = re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", cells)
                assert found, f"`cwviz {name}`: {flag} is missing from the generated reference"


def test_cli_page_holds_the_generated_reference():
    """docs/cli.md carries the marker the hook replaces, and mkdocs.yml runs that hook."""
    hooks = _hooks()
    assert hooks.MARKER in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "docs/hooks/cwviz_docs.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_a_list_right_after_a_paragraph_line_is_a_list_on_the_site():
    """The pages are written for GitHub, where ``Choices:`` then ``- a`` is a list; Python-Markdown needs a blank
    line."""
    import markdown

    page = "Choices:\n- a\n  still a\n- b\n\n```text\nkept:\n- as it is\n```"
    html = markdown.markdown(_hooks().lists_after_paragraphs(page), extensions=["fenced_code"])
    assert "<p>Choices:</p>\n<ul>" in html and "<li>b</li>" in html
    assert "kept:\n- as it is" in html


@pytest.mark.parametrize(
    "title",
    re.findall(
        r'st\.Page\("[^"]+", '
        r'title="([^"]+)"',
        (ROOT / "app.py").read_text(encoding="utf-8"),
    ),
)
def test_dashboard_guide_shows_every_page_with_its_screenshot(title):
    guide = (ROOT / "docs" / "dashboard.md").read_text(encoding="utf-8")
    section = guide.split(f"\n## {title}\n", 1)
    assert len(section) == 2, f"docs/dashboard.md has no section for the {title} page"
    images = re.findall(r"!\[[^\]]*\]\((assets/[^)]+\.png)\)", section[1].split("\n## ", 1)[0])
    assert images and all((ROOT / image).is_file() for image in images), (
        f"{title}: no screenshot from assets/ ({images})"
    )
