"""idled hook --redrive against tampered state files (real subprocess, receiver on 127.0.0.1 that acks all):
each case prints the exit status and the last stderr line. A clean refusal is exit 5 with one line naming the
file; a Python traceback is a finding."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, ".")
from tests.hook.helpers import WHSEC  # noqa: E402
from tests.hook.receiver import Receiver  # noqa: E402

GOOD = json.dumps({"delivery": "1-1", "attempts": 1, "error": "x",
                   "batch": {"events": [{"seq": 1, "ts": 1.0, "kind": "online", "uid": "u"}]}})
CASES = {
    "offset 10**30": ({"dead-letter.redrive.jsonl": GOOD + "\n", "dead-letter.redrive.offset": '{"offset": 1' + "0" * 30 + "}"}),
    "offset true": ({"dead-letter.redrive.jsonl": GOOD + "\n", "dead-letter.redrive.offset": '{"offset": true}'}),
    "nested 100k": ({"dead-letter.jsonl": "[" * 100000 + "]" * 100000 + "\n"}),
    "seq 1e400": ({"dead-letter.jsonl": GOOD.replace('"seq": 1', '"seq": 1e400') + "\n"}),
    "seq huge int": ({"dead-letter.jsonl": GOOD.replace('"seq": 1', '"seq": 1' + "0" * 5000).replace('"1-1"', '"x"') + "\n"}),
    "delivery list": ({"dead-letter.jsonl": GOOD.replace('"1-1"', '[1]') + "\n"}),
    "bad utf-8": ({"dead-letter.jsonl": GOOD.replace('"u"', '"\\udc80"') + "\n"}),
    "raw invalid utf-8": ({"dead-letter.jsonl": b"\xff\xfe" + b"\n"}),
    "a directory": ({"dead-letter.jsonl/": None}),
}
with Receiver(["ok"] * 100) as receiver:
    for name, files in CASES.items():
        state = Path(tempfile.mkdtemp()) / "state"
        state.mkdir()
        for fname, content in files.items():
            if content is None:
                (state / fname.rstrip("/")).mkdir()
            else:
                (state / fname).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
        secret = state.parent / "s"
        secret.write_text(WHSEC)
        r = subprocess.run([sys.executable, "-m", "idled.cli.main", "hook", "--redrive", "--url", receiver.url, "--state",
                            str(state), "--hook-secret-file", str(secret)], capture_output=True, text=True, timeout=60)
        err = r.stderr.strip().splitlines()
        tb = "Traceback" in r.stderr
        print(f"{name}: exit {r.returncode}{' TRACEBACK' if tb else ''}: {(err[-1] if err else '')[:220]}")
