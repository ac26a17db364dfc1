"""Help = docs = code: every `idled CMD ... --flag` in README.md and docs/*.md exists in CMD's parser, and every
flag of every parser has help text that shows its default at most once.

Commands are found in code blocks and inline code: from ``idled CMD`` to the end of that shell command (a
pipe, ``&&``, ``;``, a closing backquote or the end of the line); a trailing ``\\`` continues the line.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from idled.cli import main as cli

# Server flags after ` -- ` (idled loadtest --spawn ... -- --slots 60) belong to idled serve: not scanned.
ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_COMMAND = re.compile(r"\bidled ([a-z][a-z-]*)((?:(?!\bidled |\s--\s)[^|;&`\n]|&(?!&))*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_all_parsers(sub))
    return found


def command_parser(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def flags_of(name: str) -> set[str]:
    return {option for p in _all_parsers(command_parser(name)) for a in p._actions for option in a.option_strings}


def documented_flags() -> list[tuple[str, str, str]]:
    """(page:line, command, flag) for every flag given to an idled command in the docs."""
    out = []
    for page in PAGES:
        text = page.read_text().replace("\\\n", " ")
        for number, line in enumerate(text.splitlines(), 1):
            for match in _COMMAND.finditer(line):
                command = match.group(1)
                if command not in cli.COMMANDS:
                    continue
                for flag in _FLAG.findall(match.group(2)):
                    out.append((f"{page.relative_to(ROOT)}:{number}", command, flag))
    return out


def test_every_documented_flag_exists() -> None:
    found = documented_flags()
    assert len(found) > 30  # the scan itself works
    known = {name: flags_of(name) for name in cli.COMMANDS}
    missing = [f"{where}: idled {command} {flag}" for where, command, flag in found if flag not in known[command]]
    assert not missing, "documented flags the parser lacks:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_flag_has_help_with_its_default_once(name: str) -> None:
    problems = []
    for parser in _all_parsers(command_parser(name)):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if not action.help:
                problems.append(f"{parser.prog} {action.option_strings[0]}: no help text")
                continue
            text = formatter._expand_help(action) if "%(" in action.help else action.help
            defaults = re.findall(r"\(default[^)]*\)", text)
            if len(defaults) != len(set(defaults)) or "(default None)" in text:
                problems.append(f"{parser.prog} {action.option_strings[0]}: default shown twice: {text!r}")
    assert not problems, "\n".join(problems)


def test_serve_help_lists_the_environment_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "IDLED_CONFIG" in out and "IDLED_MAX_TIMEOUT" in out and "IDLED_DATA_DIR" in out
    assert "(default None)" not in out
    assert out.count("(default $STATE_DIRECTORY") == 1
