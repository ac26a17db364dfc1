"""docs/operations.md's install steps, run: build a wheel from the checkout, install it into a fresh venv.

idled is not published, so the only install path is the one the page documents: ``pip wheel . -w dist
--no-deps`` in the checkout, then ``pip install`` of that wheel into the target virtualenv. The test copies
the tree as a fresh clone would have it (the files git tracks or would track; no .venv, no build/), builds
the wheel there, and installs it with no dependencies into a new venv outside the checkout. Rather than
fetch trio and friends from an index (the network is not the subject here), the new venv sees this test
venv's site-packages through a ``.pth`` line, which adds that directory to sys.path without running its own
``.pth`` files -- so the checkout's editable install stays out of it and ``import idled`` can only find the
wheel's copy, as the test then checks. 3-10 s (pip may fetch setuptools for the build): marked slow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from idled import __version__

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations.md"
BUILD = "pip wheel . -w dist --no-deps"
INSTALL = "pip install dist/idled-*.whl"



def test_the_page_documents_the_steps_this_test_runs() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert BUILD in text and INSTALL in text


def fresh_clone(into: Path) -> Path:
    """The checkout's files as a clone has them: tracked, plus new files git would not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, timeout=30,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # (a file deleted in the work tree is still listed as cached)
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.mark.slow
def test_wheel_from_the_checkout_installs_and_runs(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("the test copies the checkout with git ls-files: run it from a git checkout")
    clone = fresh_clone(tmp_path / "clone")
    build = subprocess.run([sys.executable, "-m", *BUILD.split()], cwd=clone, capture_output=True, text=True, check=False,
                           timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    wheels = list((clone / "dist").glob("idled-*.whl"))
    assert [w.name for w in wheels] == [f"idled-{__version__}-py3-none-any.whl"]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip())
    (site / "deps-from-the-test-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheels[0])],
        capture_output=True, text=True, check=False, timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]

    env = {k: v for k, v in os.environ.items() if not k.startswith(("IDLED_", "PYTHON"))}
    where = subprocess.run([python, "-c", "import idled; print(idled.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    assert Path(where).is_relative_to(site), f"imported idled from {where}, not from the installed wheel"
    idled = venv / "bin" / "idled"
    version = subprocess.run([idled, "--version"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
                             timeout=30)
    assert version.returncode == 0 and __version__ in version.stdout + version.stderr
    check = subprocess.run([idled, "check-config", "--data-dir", str(tmp_path / "data"), "--port", "0"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=30)
    assert check.returncode == 0, check.stderr
    assert "configuration OK" in check.stderr
    # The status page's files are package data: in the wheel, served from the installed copy.
    assets = subprocess.run([python, "-c", "from idled.ops.statuspage import load_assets; "
                             "print(sorted((p, len(a.body)) for p, a in load_assets().items()))"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=30)
    assert assets.returncode == 0, assets.stderr
    for path in ("'/'", "'/static/status.js'", "'/static/status.css'", "'/static/favicon.svg'"):
        assert path in assets.stdout, assets.stdout
