"""Repro: a webhook receiver answering 307 with a Location whose host is invalid punycode kills `idled hook`
(an uncaught idna error from redirect_target), instead of a failed attempt that is retried/dead-lettered.
Real parts: idled serve (auth off, loopback), idled hook, a receiver on 127.0.0.1. Run from the worktree root:
  PYTHONPATH=$PWD /work/main/.venv/bin/python review/hook_bad_location.py"""
import sys
import tempfile
import time
from pathlib import Path
import trio
sys.path.insert(0, ".")
from tests import peers
from tests.hook.helpers import WHSEC, Hook, gateway_events, hook_command
from tests.hook.receiver import Receiver


async def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    state, secret_file = tmp / "state", tmp / "hook-secret"
    secret_file.write_text(WHSEC)
    port = peers.free_port()
    command = peers.serve_command(tmp / "data", "--metrics-port", "0")
    command[command.index("--port") + 1] = str(port)
    with Receiver(["307:http://xn--hooks-example.com/"] * 50) as receiver:
        async with peers.Daemon(command, tmp / "daemon.stderr"):
            hook = Hook(hook_command(receiver.url, port, state, secret_file, "--from", "1", "--batch-wait", "0.2",
                                     "--max-attempts", "2", "--backoff-base", "0.05"), tmp / "hook.stderr")
            try:
                await gateway_events(port, ["u1"], "gw")
                t0 = time.monotonic()
                while time.monotonic() - t0 < 10 and hook.proc.poll() is None \
                        and not (state / "dead-letter.jsonl").exists():
                    await trio.sleep(0.1)
                rc = hook.proc.poll()
                print("hook exit status:", rc, "(None: still running)")
                print("dead letter:", (state / "dead-letter.jsonl").exists())
                print("attempts seen by receiver:", len(receiver.attempts))
                print("hook stderr tail:\n" + "\n".join(hook.stderr().splitlines()[-40:]))
            finally:
                hook.kill()
trio.run(main)
