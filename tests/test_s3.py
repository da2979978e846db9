"""``--results s3://bucket/prefix`` against a real S3 server: moto in server mode on 127.0.0.1.

Nothing here needs the network: ``moto.server.ThreadedMotoServer`` listens on loopback, and the
endpoint and credentials come from the standard environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) that pyarrow's S3
filesystem reads by itself, exactly as on a real bucket. Launch, resume, every report, ``query``,
``nightly``, the launch lock and ``sweep verify`` run over the bucket; a writer killed mid-upload
leaves nothing visible; the secret key is never written into the results.

Ray workers inherit the environment of the Ray instance's start, so the module runs its own embedded
instance, started after the AWS variables are set (and restores the session's one afterwards).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.store import ResultStore, open_store
from tests.conftest import REPO, tiny_spec_text

moto_server = pytest.importorskip("moto.server")

runner = CliRunner()

BUCKET = "swapcheck-test"
#: Distinctive, so that finding it anywhere under the results means it leaked.
SECRET = "swapcheck-s3-test-secret-5d9e1c"
KEY_ID = "swapcheck-s3-test-key-id"


class S3:
    """The running server: its endpoint and a boto3 client on it."""

    def __init__(self, endpoint: str) -> None:
        import boto3

        self.endpoint = endpoint
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                   aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)

    def uri(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    import ray

    from orchestrator.cluster import connect, disconnect

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    saved = {k: os.environ.get(k) for k in [*env, "AWS_SESSION_TOKEN", "AWS_PROFILE"]}
    for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(k, None)
    os.environ.update(env)
    # Ray workers inherit the environment of the instance's start: restart it with the AWS variables.
    was_up = ray.is_initialized()
    disconnect()
    try:
        connect(num_cpus=2)
        handle = S3(endpoint)
        handle.client.create_bucket(Bucket=BUCKET)
        yield handle
    finally:
        disconnect()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if was_up:
            connect(num_cpus=2)
        server.stop()


def _invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def _launch(spec: Path, results: str) -> Any:
    return _invoke("sweep", "launch", str(spec), "--results", results, "--no-progress")


def _assert_no_secret(s3: S3, prefix: str, *texts: str) -> None:
    """The secret key appears in no object under ``prefix`` and in none of ``texts`` (CLI output)."""
    keys = s3.keys(prefix)
    assert keys
    for key in keys:
        body = s3.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert SECRET.encode() not in body and KEY_ID.encode() not in body, key
    for text in texts:
        assert SECRET not in text and KEY_ID not in text


@pytest.fixture(scope="module")
def launched(s3: S3, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The tiny sweep launched once onto the bucket (and relaunched: all skipped)."""
    spec = tmp_path_factory.mktemp("s3spec") / "tiny.toml"
    spec.write_text(tiny_spec_text(name="s3tiny"))
    uri = s3.uri("main")
    first = _launch(spec, uri)
    assert first.exit_code == 0, first.output
    again = _launch(spec, uri)
    assert again.exit_code == 0 and "12 skipped" in again.output, again.output
    _assert_no_secret(s3, "main", first.output, again.output)
    return uri, spec


@pytest.mark.slow  # default-suite budget (6 min on a clean clone); CI runs the slow set too
def test_launch_resume_reports_and_query_over_s3(s3: S3, launched: tuple[str, Path], tmp_path: Path) -> None:
    uri, spec = launched
    store = open_store(uri)
    assert not store.local and store.base == f"{BUCKET}/main"
    assert len(store.done_units("s3tiny")) == 12
    # Every object is a plain, complete object: no temporaries on an object store.
    assert store.temporaries() == []

    # Every report and `query` over the bucket; kdepth equals the same sweep run locally.
    for cmd in ("kdepth", "units", "replay", "predictions", "agreement", "flips", "conformance", "certificate"):
        res = _invoke("report", cmd, "--results", uri, "--format", "json")
        assert res.exit_code == 0, (cmd, res.output)
        assert "warning" not in res.output, (cmd, res.output)
    html = _invoke("report", "all", "--results", uri, "--format", "html", "-o", str(tmp_path / "all.html"))
    assert html.exit_code == 0, html.output
    assert (tmp_path / "all.html").read_text().startswith("<!")
    q = _invoke("query", "SELECT count(*) AS n FROM kdepth", "--results", uri, "--format", "json")
    assert q.exit_code == 0 and json.loads(q.stdout) == [{"n": 36}], q.output
    dupes = _invoke("query", "SELECT unit_id, impl_a, impl_b, count(*) AS c FROM kdepth GROUP BY ALL HAVING c > 1",
                    "--results", uri, "--format", "json")
    assert dupes.exit_code == 0 and json.loads(dupes.stdout) == []

    local = tmp_path / "local"
    assert _launch(spec, str(local)).exit_code == 0
    reps = [_invoke("report", "kdepth", "--results", r, "--format", "json") for r in (uri, str(local))]
    assert json.loads(reps[0].stdout) == json.loads(reps[1].stdout)

    # The launches' provenance names no credential (and the objects hold none: `launched`).
    prov = _invoke("query", "SELECT provenance_json FROM launches", "--results", uri, "--format", "json")
    assert prov.exit_code == 0 and json.loads(prov.stdout)
    assert SECRET not in prov.stdout and KEY_ID not in prov.stdout


@pytest.mark.slow  # default-suite budget: the local lock tests cover the rule; this is the S3 path
def test_launch_lock_on_s3_names_the_holder(s3: S3, tmp_path: Path) -> None:
    from storage.lock import LaunchLock

    spec = tmp_path / "lock.toml"
    spec.write_text(tiny_spec_text(name="s3lock"))
    uri = s3.uri("lock")
    store = open_store(uri)
    # settle_s above S3's one-second modification-time resolution, as the protocol requires.
    with LaunchLock(store.fs, store.base, "s3lock", local=False, settle_s=1.1):
        held = _launch(spec, uri)
        assert held.exit_code == 2, held.output
        assert f"pid {os.getpid()}" in held.output and "being launched" in held.output
        assert not store.sweeps() and store.done_units("s3lock") == set()  # nothing was written
    ok = _launch(spec, uri)
    assert ok.exit_code == 0, ok.output


def test_verify_over_s3_names_a_deleted_object_and_the_catalog_warns(s3: S3, tmp_path: Path) -> None:
    spec = tmp_path / "v.toml"
    spec.write_text(tiny_spec_text(name="s3verify", seeds=1))
    uri = s3.uri("verify")
    assert _launch(spec, uri).exit_code == 0
    clean = _invoke("sweep", "verify", "--results", uri, "--format", "json")
    assert clean.exit_code == 0 and json.loads(clean.stdout) == [], clean.output

    store = open_store(uri)
    victim = store.parquet_files("kdepth", "s3verify")[0]
    rel = store.relative(victim)
    store.fs.delete_file(victim)
    bad = _invoke("sweep", "verify", "--results", uri, "--format", "json")
    assert bad.exit_code == 1, bad.output
    problems = json.loads(bad.stdout)
    assert [p["path"] for p in problems] == [rel] and problems[0]["kind"] == "missing"
    rep = _invoke("report", "kdepth", "--results", uri, "--format", "json")
    assert rep.exit_code == 0 and "warning" in rep.output and rel.rsplit("/", 1)[1] in rep.output, rep.output


@pytest.mark.slow  # the nightly over S3; the local nightly runs by default
def test_nightly_over_s3(s3: S3, tmp_path: Path) -> None:
    suite, baseline = tmp_path / "suite.toml", tmp_path / "baseline.json"
    suite.write_text(tiny_spec_text(name="s3nightly", seeds=1))
    uri = s3.uri("nightly")
    first = _invoke("nightly", str(suite), "--baseline", str(baseline), "--results", uri, "--update-baseline")
    assert first.exit_code == 0, first.output
    second = _invoke("nightly", str(suite), "--baseline", str(baseline), "--results", uri)
    assert second.exit_code == 0 and "no regression" in second.output, second.output
    reports = [k for k in s3.keys("nightly") if k.startswith("nightly/nightly/") and k.endswith("report.json")]
    assert len(reports) == 2
    rep = json.loads(s3.client.get_object(Bucket=BUCKET, Key=sorted(reports)[-1])["Body"].read())
    assert rep["regressions"] == []
    _assert_no_secret(s3, "nightly", first.output, second.output)


_WRITER = textwrap.dedent("""
    import os, sys, time
    from storage.store import open_store
    store = open_store(sys.argv[1])
    path = store._p("table=kdepth/sweep=partial/big.parquet")
    store.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    chunk = os.urandom(6 * 1024 * 1024)
    with store.fs.open_output_stream(path) as out:  # the stream ResultStore._put writes through
        for i in range(16):
            out.write(chunk)
            if i == 2:
                print("mid-upload", flush=True)
                time.sleep(600)
""")


def test_a_writer_killed_mid_upload_leaves_no_visible_partial_file(s3: S3) -> None:
    uri = s3.uri("partial")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, uri], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "mid-upload"
        key = "partial/table=kdepth/sweep=partial/big.parquet"
        deadline = time.time() + 60  # parts are uploaded in the background
        uploads: list[dict[str, Any]] = []
        while time.time() < deadline:
            uploads = [u for u in s3.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) if u["Key"] == key]
            parts = s3.client.list_parts(Bucket=BUCKET, Key=key, UploadId=uploads[0]["UploadId"]) if uploads else {}
            if parts.get("Parts"):
                break
            time.sleep(0.1)
        assert uploads and parts.get("Parts"), "the writer never got mid-way through a multipart upload"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    store = open_store(uri)
    # The bytes already sent are in an unfinished multipart upload: no object, nothing listed.
    assert store.fs.get_file_info(store._p("table=kdepth/sweep=partial/big.parquet")).type == pafs.FileType.NotFound
    assert [k for k in s3.keys("partial") if not k.endswith("/")] == []  # only pyarrow's directory markers
    assert store.parquet_files("kdepth", "partial") == []
    assert ResultStore(uri).temporaries() == []
    s3.client.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=uploads[0]["UploadId"])




def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli.main", *args]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a trimmed demo spec twice (on S3 and locally): minutes on 2 cores
def test_sigkill_of_the_driver_then_resume_on_s3_equals_a_local_run(s3: S3, tmp_path: Path) -> None:
    """The issue's own words: `sweep launch sweeps/kdepth-demo.toml --results s3://...` completes, resumes
    after a SIGKILL with nothing lost or duplicated, and `report kdepth` over it equals a local run."""
    # The demo spec with fewer seeds and K up to 4096 (25 units instead of 252: CI's budget); the same
    # kernels and scale modes. The kill comes after 6 units, while the larger K are still running.
    text = (REPO / "sweeps" / "kdepth-demo.toml").read_text()
    assert text.count("seeds = 16") == 1 and text.count("seeds = 4\n") == 1 and text.count("stop = 16384") == 2
    spec = tmp_path / "kdepth-demo.toml"
    spec.write_text(text.replace("seeds = 4\n", "seeds = 1\n").replace("seeds = 16", "seeds = 2")
                    .replace("stop = 16384", "stop = 4096"))
    sweep = "kdepth-demo"
    total = 5 * (2 * 2 + 1)  # K = 256..4096; int8: 2 seeds x 2 scale modes, fp8: 1 seed
    uri = s3.uri("kill")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launch = _cli("sweep", "launch", str(spec), "--results", uri, "--no-progress", "--num-cpus", "2")
    # Its own session: the SIGKILL takes the driver and the Ray instance it started, so the relaunch
    # does not find a half-dead one to join (a machine losing the launcher loses both).
    proc = subprocess.Popen(launch, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    store = open_store(uri)
    deadline = time.time() + 240
    while time.time() < deadline and len(store.done_units(sweep)) < 6:
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    killed_out = proc.communicate()[0]
    gone = time.time() + 30
    while time.time() < gone:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    done_before = store.done_units(sweep)
    assert 6 <= len(done_before) < total
    time.sleep(2)  # let any orphaned worker finish its unit

    def ledger_mtimes() -> dict[str, Any]:
        return {u: store.fs.get_file_info(store._p(f"table=units/sweep={sweep}/{u}.parquet")).mtime for u in done_before}

    before = ledger_mtimes()
    time.sleep(1.1)  # S3 modification times have one-second resolution
    # The killed launcher's lease is void at once (same machine, process gone): no 120 s wait.
    out = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ledger_mtimes() == before  # no committed unit was recomputed
    assert len(store.done_units(sweep)) == total

    dupes = subprocess.run(_cli("query", "SELECT unit_id, impl_a, impl_b, count(*) AS c FROM kdepth GROUP BY ALL HAVING c > 1",
                                "--results", uri, "--format", "json"), cwd=REPO, env=env, capture_output=True, text=True)
    assert dupes.returncode == 0 and json.loads(dupes.stdout) == [], dupes.stderr
    local = tmp_path / "local"
    ref = subprocess.run(_cli("sweep", "launch", str(spec), "--results", str(local), "--no-progress", "--num-cpus", "2"),
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert ref.returncode == 0, ref.stderr
    reps = [subprocess.run(_cli("report", "kdepth", "--results", r, "--format", "json"), cwd=REPO, env=env,
                           capture_output=True, text=True, check=True).stdout for r in (uri, str(local))]
    assert json.loads(reps[0]) == json.loads(reps[1])
    verify = subprocess.run(_cli("sweep", "verify", "--results", uri), cwd=REPO, env=env, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    _assert_no_secret(s3, "kill", killed_out, out.stdout, out.stderr, verify.stdout, *reps)


_HOLDER = textwrap.dedent("""
    import sys, time
    from storage.lock import LaunchLock
    from storage.store import open_store
    store = open_store(sys.argv[1])
    LaunchLock(store.fs, store.base, "held", local=False, settle_s=1.1).acquire()
    print("held", flush=True)
    time.sleep(600)
""")


@pytest.mark.slow  # default-suite budget: the local lock tests cover the rule; this is the S3 path
def test_a_sigkilled_holders_lease_on_s3_is_void_at_once_a_live_ones_is_not(s3: S3) -> None:
    from storage.lock import LaunchLock, LockHeld

    uri = s3.uri("lease")
    store = open_store(uri)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, uri], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld, match=f"pid {proc.pid} "):
            LaunchLock(store.fs, store.base, "held", local=False, settle_s=1.1).acquire()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # Same machine, same boot and PID namespace, process gone: no waiting out the 120 s lease.
    lock = LaunchLock(store.fs, store.base, "held", local=False, settle_s=1.1).acquire()
    lock.release()
    # A holder on another machine (or whose liveness cannot be known) keeps its lease until it expires.
    claim = {"host": "elsewhere", "pid": proc.pid, "since": "now", "token": "0" * 32, "scope": "other-boot:1",
             "written_at": time.time(), "expires_at": time.time() + 60}
    with store.fs.open_output_stream(f"{store.base}/_state/locks/sweep=held/{'0' * 32}.json") as out:
        out.write(json.dumps(claim).encode())
    with pytest.raises(LockHeld, match="on elsewhere"):
        LaunchLock(store.fs, store.base, "held", local=False, settle_s=1.1).acquire()
