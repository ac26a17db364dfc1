"""The edge's /status without a token (auth on): does it reveal the cores' addresses? An edge given cores it
cannot reach ([::1] with a closed port, a name that does not resolve, an IPv4 one): GET /status with no token,
then with an api token for comparison."""
import json
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, "review")
from common import PY, Daemon, free_port  # noqa: E402

core = Daemon()  # only for its secret file and an api token
closed6, closed4 = free_port(), free_port()
mport = free_port()
cmd = [PY, "-m", "idled.cli.main", "edge", "--core", sys.argv[1].replace("PORT", str(closed6)) if len(sys.argv) > 1 else f"[::1]:{closed6}",
       "--port", str(free_port()), "--host", "127.0.0.1", "--metrics-port", str(mport), "--metrics-host", "127.0.0.1",
       "--secret-file", str(core.secret_file), "--name", "edge-secret-name"]
edge = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(core.dir / "edge.stderr", "wb"))
try:
    doc = None
    for _ in range(60):
        time.sleep(0.5)
        try:
            doc = json.load(urllib.request.urlopen(f"http://127.0.0.1:{mport}/status", timeout=2))
            if doc.get("edge", {}).get("last_error"):
                break
        except OSError:
            continue
    print("no token:", json.dumps(doc))
    req = urllib.request.Request(f"http://127.0.0.1:{mport}/status", headers={"Authorization": f"Bearer {core.token('api', 'x')}"})
    print("api token:", json.dumps(json.load(urllib.request.urlopen(req, timeout=2)).get("edge")))
finally:
    edge.kill()
    core.stop()
