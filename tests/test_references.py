"""What the shipped text files tell a newcomer to open or run must exist and work.

The units, the example configuration and the CI scripts name files of the tree in their comments
(``docs/operations.md``, ``tests/deploy/test_systemd_units.py``); each such path must exist, or the reader
follows it nowhere (the unit once pointed at ``notes/operations.md`` and ``tests/test_units.py``). And
idled is not published on PyPI, so no page, comment or message may say ``pip install idled`` (or an extra
of it): that command fails on a fresh machine. Local files only, well under a second.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Files whose comments name paths of the tree (the Markdown pages' links are tests/test_docs.py's job).
COMMENTED = [
    *sorted((ROOT / "systemd").iterdir()),
    *sorted(p for p in (ROOT / "deploy").rglob("*") if p.is_file() and p.suffix in (".toml", ".conf", ".cfg", ".yml", ".py")),
    *sorted((ROOT / ".ci").iterdir()),
]
# A file of the tree: under one of its top-level directories, with an extension (not the ALPN name idled/1),
# and not inside an absolute path (/etc/idled/idled.toml).
_TREE_PATH = re.compile(r"(?<![\w/.-])((?:docs|tests|notes|deploy|systemd|idled|examples|\.ci)/(?:[\w.-]+/)*[\w-]+\.\w+)")
_PIP_FROM_PYPI = re.compile(r"pip install\s+['\"]?idled\b")


def tree_paths(text: str) -> list[str]:
    """The paths of the tree named in ``text`` (comments and code alike: a script's paths must exist too)."""
    return _TREE_PATH.findall(text)


def test_the_path_pattern_finds_tree_paths_and_skips_absolute_ones() -> None:
    text = "see notes/operations.md; tests/test_units.py keeps it; /etc/idled/idled.toml, /opt/idled/bin/idled, idled/1"
    assert tree_paths(text) == ["notes/operations.md", "tests/test_units.py"]


def test_paths_named_in_units_config_and_ci_scripts_exist() -> None:
    missing = []
    for path in COMMENTED:
        for name in tree_paths(path.read_text(encoding="utf-8")):
            if "*" not in name and not (ROOT / name).exists():
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert COMMENTED, "no files to check: the list above is broken"
    assert missing == []


def test_nothing_says_pip_install_idled_from_pypi() -> None:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *COMMENTED,
             *sorted((ROOT / "idled").rglob("*.py")), *sorted((ROOT / "examples").rglob("*"))]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in texts if p.is_file()
             for m in _PIP_FROM_PYPI.finditer(p.read_text(encoding="utf-8", errors="replace"))]
    assert _PIP_FROM_PYPI.search("pip install 'idled[plot]'") and not _PIP_FROM_PYPI.search("pip install -e '.[plot]'")
    assert found == []


def test_gitignore_ignores_no_tracked_file_and_the_readme_secret() -> None:
    """.gitignore must not hide a tracked file (deploy/idled.toml, say: edits to it would go unseen) and must
    keep the HMAC secret the README's auth step writes into the checkout out of any commit."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("not a git checkout: the test asks git which files its ignore rules match")
    tracked_but_ignored = subprocess.run(["git", "ls-files", "-ci", "--exclude-standard"], cwd=ROOT,
                                         capture_output=True, text=True, check=True, timeout=30).stdout.split()
    assert tracked_but_ignored == []
    assert "> secret" in (ROOT / "README.md").read_text(encoding="utf-8")
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", "secret"], cwd=ROOT, check=False, timeout=30)
    assert ignored.returncode == 0, "the README's ./secret would be committable"
