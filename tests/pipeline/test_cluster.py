"""The job on a real Spark standalone cluster (master + two workers started from the pyspark package).

Slow: the cluster takes ~15-20 s to come up on two cores, each run starts its own driver JVM. Both the
``idled pipeline run --master spark://...`` command and the documented spark-submit line run against it, as
subprocesses (one SparkContext per process), and their tables must equal the reference and the local run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import idled
from idled.pipeline.generate import GenConfig, generate
from idled.pipeline.reference import run_reference
from tests.pipeline.test_pipeline import KEYS, assert_tables_equal, write_crafted

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from idled.pipeline.cluster import LocalCluster

    with LocalCluster(2, cores=1, memory="1g", workdir=str(tmp_path_factory.mktemp("cluster"))) as running:
        yield running


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("cluster-data")
    config = GenConfig(out=str(root / "gen"), users=200, hours=2, daemons=2, seed=11, segment_bytes=100_000, flappers=0.05,
                       damage=True)
    generate(config, processes=1)
    write_crafted(root / "crafted")
    dirs = [config.daemon_dir(0), config.daemon_dir(1), str(root / "crafted")]
    return {"root": root, "dirs": dirs, "reference": run_reference(dirs)[0]}


def env_for_cluster() -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    return env


def read_tables(spark: Any, out: Path) -> dict[str, list[dict[str, Any]]]:
    return {t: [r.asDict() for r in spark.read.parquet(str(out / t)).collect()] for t in KEYS}


def check_out(spark: Any, out: Path, data: dict[str, Any], local: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    tables = read_tables(spark, out)
    for table in KEYS:
        assert tables[table], table
        assert_tables_equal(tables[table], data["reference"].tables[table], table)
        assert_tables_equal(tables[table], local[table], table)
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def local_tables(spark: Any, data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    from idled.pipeline.job import JobConfig, run_job

    out = data["root"] / "local"
    run_job(JobConfig(events=tuple(data["dirs"]), out=str(out), min_partitions=5, chart=False), spark=spark)
    return read_tables(spark, out)


def executor_logs(cluster: Any) -> list[Path]:
    return list(Path(cluster.workdir).glob("worker-*/app-*/*/stderr"))


def test_run_command_on_a_standalone_cluster_equals_local(
    spark: Any, cluster: Any, data: dict[str, Any], local_tables: dict[str, Any]
) -> None:
    out = data["root"] / "on-cluster"
    argv = [sys.executable, "-m", "idled.cli.main", "pipeline", "run", "--master", cluster.master_url, "--out", str(out),
            "--min-partitions", "5", "--driver-memory", "1g", "--no-chart"]
    for directory in data["dirs"]:
        argv += ["--events", directory]
    done = subprocess.run(argv, env=env_for_cluster(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = check_out(spark, out, data, local_tables)
    assert summary["master"] == cluster.master_url
    assert summary["counts"]["events"] == data["reference"].counts["events"]
    # Piped: no progress bar, no step lines.
    assert "[Stage" not in done.stderr and "done in" not in done.stderr
    # The work ran in executors the workers started (one application directory per worker).
    apps = {p.parent.parent.name for p in executor_logs(cluster)}
    assert len({p.parent.parent.parent.name for p in executor_logs(cluster)}) == 2 and apps


@pytest.mark.long  # (~26 s: the cluster itself runs in the test before it, on every CI run)
def test_documented_spark_submit_line_on_the_cluster(
    spark: Any, cluster: Any, data: dict[str, Any], local_tables: dict[str, Any], tmp_path: Path
) -> None:
    """docs/pipeline.md: zip the package, spark-submit --py-files it with submit.py as the entry."""
    from idled.pipeline import submit
    from idled.pipeline.cluster import spark_home

    package = Path(idled.__file__).parent
    archive = tmp_path / "idled.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in package.rglob("*.py"):
            zf.write(path, str(path.relative_to(package.parent)))
    out = data["root"] / "spark-submit"
    argv = [os.path.join(spark_home(), "bin", "spark-submit"), "--master", cluster.master_url, "--py-files", str(archive),
            "--driver-memory", "1g", submit.__file__, "--out", str(out), "--min-partitions", "5", "--no-chart", "--json"]
    for directory in data["dirs"]:
        argv += ["--events", directory]
    env = env_for_cluster()
    env.pop("PYTHONPATH", None)  # the executors get idled from the shipped zip (and msgpack from PYSPARK_PYTHON)
    env.pop("SPARK_HOME", None)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["master"] == cluster.master_url
    check_out(spark, out, data, local_tables)


def test_stopping_a_cluster_leaves_no_process(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from idled.pipeline.cluster import LocalCluster

    one = LocalCluster(1, workdir=str(tmp_path))
    with pytest.raises(RuntimeError):
        with one:
            pids = one.pids()
            assert len(pids) == 2 and all(_alive(pid) for pid in pids)
            raise RuntimeError("a failing test inside the cluster")
    assert not any(_alive(pid) for pid in pids) and not processes_mentioning(str(tmp_path))
    assert "Registering worker" in (tmp_path / "master.log").read_text()
    shutil.rmtree(tmp_path / "worker-0", ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie would still answer: it has been reaped by LocalCluster.stop (proc.wait), so this is a live one.
    return True


def test_cluster_command_prints_the_master_url_and_stops_on_sigterm(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    proc = subprocess.Popen(
        [sys.executable, "-m", "idled.cli.main", "pipeline", "cluster", "--workers", "1", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "spark://127.0.0.1:" in line, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert "Registering worker" in (tmp_path / "master.log").read_text()
    assert not processes_mentioning(str(tmp_path))  # the worker JVM (its --work-dir is under tmp_path) is gone


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:
                    if text.encode() in file.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found
