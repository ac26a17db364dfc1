"""The docs' code blocks marked runnable run as written and print what the page says they print.

Theory of operation
-------------------
A page marks a block with an HTML comment on the line right before its fence (GitHub shows neither):

* ``<!-- runnable -->`` before a ``python`` or ``sh`` block: run it (python: this interpreter; sh:
  ``bash -e``) in a directory of its own shared by the page's blocks, in order, with the interpreter's
  ``bin/`` (``idled``, ``python3``) first on PATH. It must exit 0 within ``BLOCK_TIMEOUT`` seconds.
  Options, space-separated: ``daemon`` (an ``idled serve`` runs for the page, started before the first block
  that asks; ``daemon="--api-port 8080"`` gives it flags), ``background`` (started, then left running while
  the page's later blocks run, stopped with SIGTERM after the last: a receiver, a server),
  ``ports="8090"`` (ports the page's own programs listen on: a background block is waited for until each
  accepts a connection).
* ``<!-- output -->`` before a fence: what the runnable block above it prints on stdout;
  ``<!-- output background -->``: what the last background block above prints by the time it is stopped
  (a receiver's lines, shown after the block that made it print them).

Ports: the daemon's (7878, 9878 and those in ``daemon=``) and those in ``ports=`` are replaced, in the blocks
and the flags, by free ports, so a run never collides with a daemon already on the machine -- which means a
runnable block writes every port it uses (a tool's default port is not replaced: ``--host
127.0.0.1:7878``, not nothing). Output: whitespace is not significant, every number matches any number
(times, seqs and timestamps differ from run to run), and ``...`` matches anything. CONTRIBUTING.md says
the same for writers.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from tests.peers import Daemon, free_port, serve_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT = 30.0
DAEMON_PORTS = (7878, 9878)  # its client port and metrics port, as the pages write them
LANGUAGES = ("python", "sh", "bash")

_FENCE = re.compile(r"^ {0,3}(```|~~~)\s*(\S*)")
_RUNNABLE = re.compile(r"^\s*<!--\s*runnable\b(.*?)-->\s*$")
_OUTPUT = re.compile(r"^\s*<!--\s*output(\s+background)?\s*-->\s*$")
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"


@dataclass
class Block:
    """One runnable block of a page: where, how, and what it must print."""

    where: str  # page:line of the fence
    language: str
    text: str
    daemon: list[str] | None = None  # the daemon's flags; None: no daemon asked for
    background: bool = False
    ports: list[int] = field(default_factory=list)
    output: str | None = None


def _options(comment: str, where: str) -> dict[str, str]:
    options = {}
    for token in shlex.split(comment):
        key, _, value = token.partition("=")
        if key not in ("daemon", "background", "ports"):
            raise ValueError(f"{where}: unknown runnable option {token!r}")
        options[key] = value
    return options


def runnable_blocks(page: Path, root: Path = ROOT) -> list[Block]:
    """The page's runnable blocks in order, each with its output if the page shows one."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next((j for j in range(index + 1, len(lines)) if _FENCE.match(lines[j])), len(lines))
        body = "\n".join(lines[index + 1:end]) + "\n"
        before = lines[index - 1] if index else ""
        where = f"{page.relative_to(root)}:{index + 1}"
        if marker := _RUNNABLE.match(before):
            if fence.group(2) not in LANGUAGES:
                raise ValueError(f"{where}: a runnable block must be one of {LANGUAGES}, not {fence.group(2)!r}")
            options = _options(marker.group(1), where)
            found.append(Block(where, fence.group(2), body,
                               daemon=shlex.split(options["daemon"]) if "daemon" in options else None,
                               background="background" in options,
                               ports=[int(p) for p in options.get("ports", "").split(",") if p]))
        elif output := _OUTPUT.match(before):
            owners = [b for b in found if b.background] if output.group(1) else found
            if not owners or owners[-1].output is not None:
                raise ValueError(f"{where}: an output block with no runnable block above it to show")
            owners[-1].output = body
        index = end + 1
    return found


def with_ports(text: str, ports: dict[int, int]) -> str:
    """``text`` with each port of ``ports`` (as a whole number) replaced by its free stand-in."""
    for written, actual in ports.items():
        text = re.sub(rf"(?<![\d.]){written}(?![\d.])", str(actual), text)
    return text


def output_pattern(expected: str) -> re.Pattern[str]:
    """Whitespace dropped, every number any number, ``...`` anything."""
    parts = re.split(rf"(\.\.\.|{_NUMBER})", re.sub(r"\s+", "", expected))
    regex = "".join(".*?" if part == "..." else _NUMBER if re.fullmatch(_NUMBER, part) else re.escape(part)
                    for part in parts if part)
    return re.compile(regex, re.S)


def prints_as_shown(expected: str, actual: str) -> bool:
    return output_pattern(expected).fullmatch(re.sub(r"\s+", "", actual)) is not None


def _block_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Run:
    """One block's process, in a session of its own so that whatever it left running is stopped with it."""

    def __init__(self, block: Block, text: str, work: Path, number: int) -> None:
        self.block = block
        script = work / f".block-{number}.{'py' if block.language == 'python' else 'sh'}"
        script.write_text(text, encoding="utf-8")
        command = [sys.executable, script.name] if block.language == "python" else ["bash", "-e", script.name]
        self.stdout, self.stderr = work / f".block-{number}.out", work / f".block-{number}.err"
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(command, cwd=work, env=_block_env(), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err, start_new_session=True)

    async def finish(self, timeout: float) -> int | None:
        """Its exit status, or None if it ran past ``timeout`` (then killed)."""
        with trio.move_on_after(timeout):
            while self.proc.poll() is None:
                await trio.sleep(0.05)
        status = self.proc.poll()
        self.stop(signal.SIGKILL)
        return status

    def stop(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def report(self) -> str:
        err = self.stderr.read_text(errors="replace")[-3000:]
        return f"stdout:\n{self.stdout.read_text(errors='replace')[-3000:]}\nstderr:\n{err}"


async def _listening(port: int, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return True
            await trio.sleep(0.05)
    return False


def _check_output(run: Run) -> None:
    block = run.block
    if block.output is not None:
        actual = run.stdout.read_text(errors="replace")
        assert prints_as_shown(block.output, actual), (
            f"{block.where} printed\n{actual}\nwhere the page shows\n{block.output}\n{run.report()}")


RUNNABLE_PAGES = [page for page in PAGES if runnable_blocks(page)]


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
async def test_runnable_blocks_run_as_written(page: Path, tmp_path: Path) -> None:
    blocks = runnable_blocks(page)
    ports = {port: free_port() for port in DAEMON_PORTS}
    for block in blocks:
        for port in [*block.ports, *(int(p) for p in re.findall(r"\b\d{4,5}\b", " ".join(block.daemon or [])))]:
            ports.setdefault(port, free_port())
    work = tmp_path / "work"
    work.mkdir()
    background: list[Run] = []
    async with AsyncExitStack() as stack:
        daemon: Daemon | None = None
        for number, block in enumerate(blocks):
            if block.daemon is not None and daemon is None:
                flags = [with_ports(flag, ports) for flag in block.daemon]
                command = serve_command(tmp_path / "data", "--port", str(ports[7878]),
                                        "--metrics-port", str(ports[9878]), *flags)
                daemon = await stack.enter_async_context(Daemon(command, tmp_path / "daemon.err"))
            run = Run(block, with_ports(block.text, ports), work, number)
            if block.background:
                background.append(run)
                for port in block.ports:
                    assert await _listening(ports[port], 10), f"{block.where} never listened:\n{run.report()}"
                continue
            status = await run.finish(BLOCK_TIMEOUT)
            context = run.report() + (f"\nthe daemon's stderr:\n{daemon.stderr()[-3000:]}" if daemon else "")
            assert status is not None, f"{block.where} still ran after {BLOCK_TIMEOUT} s:\n{context}"
            assert status == 0, f"{block.where} exited {status}:\n{context}"
            _check_output(run)
        for run in background:
            run.stop(signal.SIGTERM)
            _check_output(run)


FIRST_EXAMPLE_RUNS = ("client.md", "api.md", "hook.md")  # pages whose first example can run on loopback


@pytest.mark.parametrize("name", FIRST_EXAMPLE_RUNS)
def test_the_first_example_of_a_page_is_runnable(name: str) -> None:
    page = ROOT / "docs" / name
    first_fence = next(number for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
                       if _FENCE.match(line))
    blocks = runnable_blocks(page)
    assert blocks and blocks[0].where == f"docs/{name}:{first_fence}", f"{name}'s first example is not marked runnable"


# -- the runner's own rules ----------------------------------------------------------------------------


def test_output_matching_ignores_numbers_and_whitespace_only() -> None:
    shown = "12:03:19.802  logged in as 'alice' on 127.0.0.1:7878\n{\"since\":1767225600.25,\n  \"x\":null}"
    assert prints_as_shown(shown, "09:41:02.5 logged in as 'alice' on 127.0.0.1:40123\n{\"since\":1.5,\"x\":null}")
    assert not prints_as_shown(shown, "09:41:02.5 logged in as 'bob' on 127.0.0.1:40123\n{\"since\":1.5,\"x\":null}")
    assert not prints_as_shown(shown, "09:41:02.5 logged in as 'alice' on 127.0.0.1:40123\n{\"since\":null,\"x\":null}")
    assert prints_as_shown("a ... z", "a b c z") and not prints_as_shown("a ... z", "a b c")


def test_ports_are_replaced_as_whole_numbers_only() -> None:
    assert with_ports("127.0.0.1:7878 78780 17878 1.7878 7878", {7878: 40001}) == "127.0.0.1:40001 78780 17878 1.7878 40001"


def test_markers_parse(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable daemon=\"--api-port 8080\" background ports=8090 -->\n```python\nprint(1)\n```\n"
                    "text\n<!-- output -->\n```\n1\n```\n```sh\nnot marked\n```\n")
    [block] = runnable_blocks(page, tmp_path)
    assert (block.where, block.language, block.text) == ("page.md:2", "python", "print(1)\n")
    assert (block.daemon, block.background, block.ports, block.output) == (["--api-port", "8080"], True, [8090], "1\n")
