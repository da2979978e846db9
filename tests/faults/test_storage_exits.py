"""Storage faults and bad ``--results`` are one line and an exit code, never a stack dump.

Exit 2 (bad input, nothing written): a scheme swapcheck does not open (``hdfs://``, ``abfs://``, a
typo), ``file://relative/path``, credentials in the URI, a bucket that does not exist (launch), an
invalid ``SWAPCHECK_STORE_TIMEOUT_S``, ``swapcheck db`` of object-store results into a ``.duckdb``.
Exit 3 (the store failed): an S3 endpoint that refuses connections, credentials the store rejects
(launch and query), a read-only results file system (launch). Each case runs the real CLI in
process (CliRunner) against real servers on 127.0.0.1 (moto's S3 server, in a process of its own),
or in a subprocess where it needs one (a read-only bind mount).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import REPO, tiny_spec_text
from tests.faults.test_bounded_waits import BUCKET, Moto, _free_port

pytest.importorskip("moto.server")

cli = CliRunner()


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _one_error_line(output: str) -> str:
    errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert "Traceback" not in output and len(errors) == 1, output
    return errors[0]


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(tiny_spec_text(name="exits", seeds=1))
    return path


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


# -- URIs swapcheck does not open: exit 2, naming the URI and what is allowed ------------------------

BAD_URIS = {
    "hdfs://namenode/results": "the scheme 'hdfs://' is not supported",
    "abfs://container/results": "the scheme 'abfs://' is not supported",
    "s4://bucket/results": "the scheme 's4://' is not supported",
    "file://relative/path": "a file URI names an absolute path",
    "file://host.example/abs": "a file URI names an absolute path",
    "s3://AKIAKEY:s3cr3t@bucket/results": "credentials in the URI are not accepted",
    "s3://bucket/results?bogus=1": "Unexpected query parameter",
    "gs://bucket/results?bogus=1": "Unexpected query parameter",
    "s3:///results": "no bucket",
}

COMMANDS = {
    "query": lambda uri, spec: ["query", "SELECT 1", "--results", uri],
    "launch": lambda uri, spec: ["sweep", "launch", str(spec), "--results", uri, "--no-progress"],
    "verify": lambda uri, spec: ["sweep", "verify", "--results", uri],
    "db": lambda uri, spec: ["db", "--results", uri, "--out", "views.sql"],
    "report": lambda uri, spec: ["report", "units", "--results", uri],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("uri", sorted(BAD_URIS))
def test_a_results_uri_swapcheck_does_not_open_exits_2_naming_it(uri: str, command: str, spec: Path, in_tmp: Path) -> None:
    res = cli.invoke(app, COMMANDS[command](uri, spec))
    assert res.exit_code == 2, res.output
    line = _one_error_line(res.output)
    assert BAD_URIS[uri] in line
    assert "s3cr3t" not in res.output  # a secret in a refused URI is never echoed
    assert _tree(in_tmp) == []  # nothing written


def test_filesystems_give_every_object_store_its_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    import pyarrow.fs as pafs

    from storage.errors import StorageError
    from storage.filesystems import filesystem_from_uri

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # no lookup of the bucket's region
    monkeypatch.setenv("SWAPCHECK_STORE_TIMEOUT_S", "12")
    s3, path = filesystem_from_uri("s3://bucket/a/b")
    options = s3.__reduce__()[1][0]
    assert path == "bucket/a/b" and options["request_timeout"] == 4.0 and options["connect_timeout"] == 4.0
    assert options["endpoint_override"] == "http://127.0.0.1:1"
    gcs, path = filesystem_from_uri("gs://bucket/a")
    assert isinstance(gcs, pafs.GcsFileSystem) and gcs.__reduce__()[1][0]["retry_time_limit"] == timedelta(seconds=12)
    local, path = filesystem_from_uri("file:///tmp/x/")
    assert isinstance(local, pafs.LocalFileSystem) and path == "/tmp/x"
    for bad in ("0", "2", "nan", "soon", "1e9"):
        monkeypatch.setenv("SWAPCHECK_STORE_TIMEOUT_S", bad)
        with pytest.raises(StorageError, match="SWAPCHECK_STORE_TIMEOUT_S"):
            filesystem_from_uri("s3://bucket/a")


def test_an_invalid_store_timeout_exits_2_naming_the_variable(monkeypatch: pytest.MonkeyPatch, in_tmp: Path) -> None:
    monkeypatch.setenv("SWAPCHECK_STORE_TIMEOUT_S", "forever")
    res = cli.invoke(app, ["query", "SELECT 1", "--results", "s3://bucket/x"])
    assert res.exit_code == 2 and "SWAPCHECK_STORE_TIMEOUT_S='forever'" in _one_error_line(res.output)


# -- the S3 server: missing bucket, refused endpoint, rejected credentials --------------------------

@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    server = Moto()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def moto_auth() -> Iterator[Moto]:
    """A server that checks credentials (its first request, creating the bucket, is let through)."""
    server = Moto({"INITIAL_NO_AUTH_ACTION_COUNT": "1"})
    try:
        yield server
    finally:
        server.stop()


def _use(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SWAPCHECK_STORE_TIMEOUT_S", "3")


def test_launch_into_a_bucket_that_does_not_exist_exits_2_and_writes_nothing(
        ray_local: Any, moto: Moto, monkeypatch: pytest.MonkeyPatch, spec: Path) -> None:
    _use(monkeypatch, moto.env())
    res = cli.invoke(app, ["sweep", "launch", str(spec), "--results", "s3://no-such-bucket/x", "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "there is no bucket 'no-such-bucket'" in _one_error_line(res.output)
    assert "no-such-bucket" not in [b["Name"] for b in moto.client.list_buckets()["Buckets"]]


def test_query_of_a_bucket_that_does_not_exist_exits_2(moto: Moto, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, moto.env())
    res = cli.invoke(app, ["query", "SELECT 1", "--results", "s3://no-such-bucket/x"])
    assert res.exit_code == 2 and "no such directory" in _one_error_line(res.output)


STORE_FAULTS = ["refused", "wrong-credentials"]


def _fault_env(fault: str, moto_auth: Moto) -> dict[str, str]:
    if fault == "refused":
        return {**moto_auth.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{_free_port()}"}
    return {**moto_auth.env(), "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG", "AWS_SECRET_ACCESS_KEY": "wrong-secret-value"}


@pytest.mark.parametrize("fault", STORE_FAULTS)
@pytest.mark.parametrize("command", ["query", "launch", "verify", "report"])
def test_a_store_that_refuses_or_rejects_the_credentials_exits_3_in_one_line(
        moto_auth: Moto, monkeypatch: pytest.MonkeyPatch, spec: Path, command: str, fault: str) -> None:
    _use(monkeypatch, _fault_env(fault, moto_auth))
    res = cli.invoke(app, COMMANDS[command](f"s3://{BUCKET}/x", spec))
    assert res.exit_code == 3, res.output
    line = _one_error_line(res.output)
    assert ("ACCESS_DENIED" in line or "INVALID_ACCESS_KEY_ID" in line) if fault != "refused" else "connect" in line.lower()
    assert "wrong-secret-value" not in res.output


# -- swapcheck db over an object store ---------------------------------------------------------------

def test_db_of_object_store_results_into_a_duckdb_file_exits_2_and_the_sql_export_works(
        moto: Moto, monkeypatch: pytest.MonkeyPatch, in_tmp: Path) -> None:
    _use(monkeypatch, moto.env())
    moto.client.put_object(Bucket=BUCKET, Key="dbcase/table=sweeps/sweep=x/spec.parquet", Body=b"")
    res = cli.invoke(app, ["db", "--results", f"s3://{BUCKET}/dbcase", "--out", "views.duckdb"])
    assert res.exit_code == 2, res.output
    assert "--out views.duckdb" in _one_error_line(res.output) and "views.sql" in res.output
    assert _tree(in_tmp) == []  # no database, no temporary
    ok = cli.invoke(app, ["db", "--results", f"s3://{BUCKET}/dbcase", "--out", "views.sql"])
    assert ok.exit_code == 0, ok.output
    assert (in_tmp / "views.sql").read_text().startswith("-- swapcheck db:")


# -- a read-only results file system (launch) -------------------------------------------------------

def _read_only_runner() -> list[str] | None:
    """How to run a command over a read-only results directory here: None when not root (a 0555
    directory refuses writes), else a read-only bind mount in a user and mount namespace of its own
    (root ignores file modes); skip where neither works."""
    if os.geteuid() != 0:
        return None
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "-r", "-m", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("running as root without user namespaces: no way to make a read-only directory here")
    return [unshare or "unshare", "-r", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"']


@pytest.mark.slow
def test_launch_onto_a_read_only_file_system_exits_3_in_one_line(tmp_path: Path, spec: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    wrap = _read_only_runner()
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "sweep", "launch", str(spec), "--results", str(results),
           "--no-progress", "--num-cpus", "1"]
    if wrap is None:
        results.chmod(0o555)
        full = cmd
    else:
        full = [*wrap, str(results), *cmd]
    try:
        out = subprocess.run(full, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                             text=True, timeout=300)
    finally:
        results.chmod(0o755)
    assert out.returncode == 3, out.stderr[-3000:]
    line = _one_error_line(out.stderr)
    assert str(results) in line and ("Read-only" in line or "Permission denied" in line), line
    assert _tree(results) == []
