"""A Spark standalone cluster on this machine, started from the installed pyspark package.

Theory of operation
-------------------
The pyspark wheel ships Spark's jars and ``bin/spark-class``, which is all a standalone cluster needs: one
``org.apache.spark.deploy.master.Master`` JVM and N ``org.apache.spark.deploy.worker.Worker`` JVMs that
register with it. `LocalCluster` starts them bound to 127.0.0.1 (``SPARK_LOCAL_IP`` too, so nothing listens
or advertises on another interface), each in its own process group with its output in a log file under
``workdir``; it is ready when the master's log says every worker registered. Executors are child processes
of the workers (same process group), and their Python workers run ``PYSPARK_PYTHON``; the environment the
cluster is started with -- ``PYTHONPATH`` included -- is what they inherit.

`stop` sends SIGTERM to every process group, waits, then SIGKILLs what is left: a failed test or a Ctrl-C
must not leave JVMs behind. It is idempotent and runs from ``__exit__`` and from an ``atexit`` hook.

Used by the tests (a session-scoped fixture) and by ``idled pipeline cluster`` for users who want to try
the ``spark://`` path on one box.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import argparse
from collections.abc import Callable, Mapping
from typing import IO, Final

__all__ = ["ClusterError", "LocalCluster", "spark_home"]

START_TIMEOUT: Final = 120.0  # seconds for the master and every worker to come up (~15 s on 2 busy cores)
STOP_GRACE: Final = 10.0


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the log to read."""


def spark_home() -> str:
    """SPARK_HOME: the environment's, else the installed pyspark package directory (it ships bin/ and jars/)."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return home
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ClusterError("pyspark is not installed (the pipeline extra: pip install -e '.[pipeline]' in the checkout)")
    return os.path.dirname(spec.origin)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalCluster:
    """A master and `workers` workers on 127.0.0.1; ``with LocalCluster() as c: ... c.master_url ...``."""

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ValueError("a cluster needs at least one worker with one core")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.workdir = workdir or tempfile.mkdtemp(prefix="idled-spark-cluster-")
        os.makedirs(self.workdir, exist_ok=True)
        self.port = 0
        self.master_url = ""
        self._env = dict(os.environ if env is None else env)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    # ------------------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, args: list[str]) -> None:
        home = spark_home()
        log = open(os.path.join(self.workdir, f"{name}.log"), "wb")
        self._logs.append(log)
        env = dict(self._env)
        env.update(SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="localhost")
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        # spark-class execs the JVM: the pid is the JVM's; its own process group holds its executors too.
        proc = subprocess.Popen(
            [os.path.join(home, "bin", "spark-class"), *args], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        self._procs.append(proc)

    def _master_log(self) -> str:
        with open(os.path.join(self.workdir, "master.log"), errors="replace") as file:
            return file.read()

    def start(self) -> None:
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.port = _free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                               "--webui-port", "0"])
        self._wait(lambda log: "I have been elected leader" in log, "the master")
        for index in range(self.workers):
            work = os.path.join(self.workdir, f"worker-{index}")
            os.makedirs(work, exist_ok=True)
            self._spawn(f"worker-{index}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(self.cores),
                "--memory", self.memory, "--webui-port", "0", "--work-dir", work, self.master_url,
            ])
        self._wait(lambda log: len(re.findall(r"Registering worker", log)) >= self.workers, f"{self.workers} worker(s)")

    def _wait(self, ready: Callable[[str], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise ClusterError(f"{what}: a Spark process exited with status {proc.returncode}; see {self.workdir}/*.log")
            if ready(self._master_log()):
                return
            time.sleep(0.25)
        raise ClusterError(f"{what} not up after {START_TIMEOUT:.0f} s; see {self.workdir}/*.log")

    def stop(self) -> None:
        """Terminate every process group (executors included), SIGKILL after the grace period. Idempotent."""
        procs, self._procs = self._procs, []
        for proc in reversed(procs):  # workers first, the master last
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_GRACE
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # The group may outlive its leader (an executor whose worker died): kill the group regardless.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for log in self._logs:
            log.close()
        self._logs = []
        atexit.unregister(self.stop)

    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, metavar="N", help="worker JVMs (default 2)")
    parser.add_argument("--cores", type=int, default=1, metavar="N", help="cores per worker (default 1)")
    parser.add_argument("--memory", default="1g", metavar="SIZE", help="memory per worker (default 1g)")
    parser.add_argument("--workdir", default=None, metavar="DIR",
                        help="logs and worker directories (default: a new temporary directory)")


def run_cluster(args: argparse.Namespace) -> int:
    try:
        cluster = LocalCluster(args.workers, cores=args.cores, memory=args.memory, workdir=args.workdir)
    except ValueError as exc:
        print(f"idled pipeline cluster: {exc}", file=sys.stderr)
        return 2
    # SIGTERM stops it like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with cluster:
            print(f"idled pipeline cluster: {cluster.master_url} ({cluster.workers} worker(s), logs in {cluster.workdir}); "
                  "Ctrl-C stops it", flush=True)
            while True:
                time.sleep(3600)
    except ClusterError as exc:
        print(f"idled pipeline cluster: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
