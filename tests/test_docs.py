"""The documentation's links and the README's two command lines.

Theory of operation
-------------------
README.md is the front page and docs/*.md hold the rest, so the pages link to each other, to headings
(``page.md#anchor``) and to files of the tree (``../idled/core/wheel.py``). Every relative link must resolve
to an existing file or directory, and every ``#anchor`` to a heading of its target page, slugged as GitHub
does (lower case; punctuation other than ``-`` and ``_`` removed; each space a hyphen; a repeated heading
gets ``-1``, ``-2``, ...). Links and headings inside fenced code blocks and inline code are not links.

CI runs the test command it extracts from README.md with a sed expression (``.ci/run``); the test below
runs that very expression, read from ``.ci/run``, so the README cannot drift from what CI runs. Everything
here reads local files: no network, well under a second.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

DAEMON_LINE = "    python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/idled serve"
TEST_LINE = (
    "    bash .ci/system-deps && python3 -m venv .venv && .venv/bin/pip install -e '.[test,pipeline,plot]'"
    " && .venv/bin/mypy idled && .venv/bin/ruff check idled tests && .venv/bin/pytest -q -m 'not long'"
    " && (cd clients/js && npm ci && npm test)"
)
MAX_README_LINES = 250

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked (their text is not markup)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(_INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line))
    return lines


def links(text: str) -> list[str]:
    """Every link target of a page: inline links, images and reference definitions, code excluded."""
    found: list[str] = []
    for line in prose_lines(text):
        found.extend(m.group(1) for m in _INLINE_LINK.finditer(line))
        if m := _REFERENCE_DEF.match(line):
            found.append(m.group(1))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped, spaces hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of every heading of a page, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or not (m := _HEADING.match(line)):
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """One line per link of ``page`` that does not resolve (paths shown relative to ``root``)."""
    problems = []
    for target in links(page.read_text(encoding="utf-8")):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # absolute (https:, mailto:): not checked, no network here
        path_part, _, fragment = target.partition("#")
        destination = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not destination.exists():
            problems.append(f"{page.relative_to(root)}: {target}: no such file")
            continue
        if fragment:
            if destination.suffix != ".md" or destination.is_dir():
                problems.append(f"{page.relative_to(root)}: {target}: anchor into a file that is not a page")
            elif unquote(fragment) not in anchors(destination.read_text(encoding="utf-8")):
                problems.append(f"{page.relative_to(root)}: {target}: no heading #{fragment}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert links(page.read_text(encoding="utf-8")), f"{page.name} links nowhere: the link parser is broken"
    assert broken_links(page) == []


def readme_section(heading: str) -> str:
    """The text of one ``## heading`` section of the README (to the next ``##``)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no section '## {heading}'"
    return match.group(1)


def test_the_readme_documentation_list_links_every_page() -> None:
    listed = {target.partition("#")[0] for target in links(readme_section("Documentation"))}
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert len(pages) > 10
    assert sorted(pages - listed) == [], "pages missing from README.md's Documentation list"


def test_the_readme_command_table_lists_every_command() -> None:
    from idled.cli.main import COMMANDS

    rows = re.findall(r"^\| `idled ([a-z-]+)` \|", readme_section("Commands"), re.M)
    assert len(rows) == len(set(rows)), "a command listed twice"
    missing, unknown = sorted(set(COMMANDS) - set(rows)), sorted(set(rows) - set(COMMANDS))
    assert (missing, unknown) == ([], []), "README.md's command table: (commands missing, not commands)"


def test_readme_is_a_front_page() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES


def test_readme_keeps_the_daemon_command_line() -> None:
    assert DAEMON_LINE in README.read_text(encoding="utf-8").splitlines()


def test_readme_test_line_is_what_ci_extracts() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    match = re.search(r"(sed -n '[^']*' README\.md \| head -n 1)", ci)
    assert match, ".ci/run no longer extracts the test line with sed"
    extracted = subprocess.run(
        ["bash", "-c", match.group(1)], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
    ).stdout
    assert extracted == TEST_LINE.removeprefix("    ") + "\n"
    assert TEST_LINE in README.read_text(encoding="utf-8").splitlines()


# -- the checker itself, on pages written for the purpose -------------------------------------------------


def test_slugs_follow_github() -> None:
    assert slug("Durability: `--fsync always | interval | never`") == "durability---fsync-always--interval--never"
    assert slug("JSON (`--json FILE`, `-` for stdout)") == "json---json-file---for-stdout"
    assert slug("What `deploy/` holds") == "what-deploy-holds"
    assert slug("Client -> server") == "client---server"
    assert anchors("# A\n## A\n```\n# A\n```\n## B_c\n") == {"a", "a-1", "b_c"}


def test_checker_reports_missing_files_and_headings(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n## Part two\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#part-two) [self](#here) [web](https://example.invalid/x)\n"
        "# Here\n"
        "[gone](missing.md) [bad anchor](other.md#part-three) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "page.md: missing.md: no such file",
        "page.md: other.md#part-three: no heading #part-three",
    ]
