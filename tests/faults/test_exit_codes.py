"""Every fault an exit code (issue #24, items 6 and 7): classified by type, shown as one line.

- an error of the libraries below that is a storage or infrastructure fault (``OSError`` and so
  pyarrow's ``ArrowIOError``, Ray's errors, DuckDB's I/O errors) is exit 3 with one ``error:`` line,
  never a traceback (``-v`` keeps it); a ``RayTaskError`` is its cause's class; a bug stays a bug
  (exit 1 with its traceback);
- a spec's labels and names (the words that reach tables, terminals and paths) refuse control
  characters, naming the field; exit 2, nothing written;
- a path field holding an environment reference (``${AWS_SECRET_ACCESS_KEY}``) is checked after it is
  expanded, but neither the reference nor what the variable holds is ever echoed.
"""

from __future__ import annotations

import errno
import hashlib
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray.exceptions as rex
import typer
from typer.testing import CliRunner

from orchestrator.cli.common import user_errors
from orchestrator.cli.main import _App, app
from orchestrator.errors import (
    Interrupted,
    SpecError,
    StorageFailure,
    UsageError,
    exit_code_for,
    user_message,
)
from orchestrator.spec import parse_spec
from storage.errors import QueryError, StorageFault
from tests.conftest import tiny_spec_text

cli = CliRunner()


def _task_error(cause: BaseException) -> BaseException:
    """What ``ray.get`` raises for a task that raised ``cause``: a RayTaskError that is also the cause's class."""
    traceback_str = "Traceback (most recent call last):\n  File \"worker.py\", line 1, in run\n" + repr(cause)
    wrapped: BaseException = rex.RayTaskError("execute_unit", traceback_str, cause).as_instanceof_cause()
    return wrapped


def _real(make: Any) -> BaseException:
    """The exception a real call raises."""
    try:
        make()
    except Exception as exc:  # noqa: BLE001 - the exception is the point
        return exc
    raise AssertionError("it did not raise")


CASES: list[tuple[str, Any, int | None]] = [
    # storage and network: OSError and pyarrow's ArrowIOError (an OSError), as they are raised
    ("disk full", lambda: OSError(errno.ENOSPC, "No space left on device", "/r/table=units/x.parquet"), 3),
    ("read-only file system", lambda: OSError(errno.EROFS, "Read-only file system", "/r"), 3),
    ("permission", lambda: PermissionError(errno.EACCES, "Permission denied", "/r/_state"), 3),
    ("refused", lambda: ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), 3),
    ("timeout", lambda: TimeoutError("the object store did not answer within 30 s"), 3),
    ("pyarrow read of a missing file", lambda: _real(lambda: pq.read_table("/nonexistent/x.parquet")), 3),
    ("pyarrow ArrowIOError", lambda: pa.ArrowIOError("When getting information for key 'x' in bucket 'b': "
                                                     "AWS Error NETWORK_CONNECTION"), 3),
    # Ray
    ("RaySystemError", lambda: rex.RaySystemError("the core worker died"), 3),
    ("GetTimeoutError", lambda: rex.GetTimeoutError("Get timed out: some object(s) not ready."), 3),
    ("WorkerCrashedError", lambda: rex.WorkerCrashedError(), 3),
    ("NodeDiedError", lambda: rex.NodeDiedError("node 1234 died"), 3),
    ("OutOfMemoryError", lambda: rex.OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node ..."), 3),
    ("ObjectLostError", lambda: rex.ObjectLostError("ab" * 14, None, "<unknown>"), 3),
    ("ObjectStoreFullError", lambda: rex.ObjectStoreFullError("the object store is full"), 3),
    ("TaskUnschedulableError", lambda: rex.TaskUnschedulableError("no node has the resources"), 3),
    ("RayTaskError(StorageFault)", lambda: _task_error(StorageFault("/r/table=units", "OSError: [Errno 28] No space left")), 3),
    ("RayTaskError(OSError)", lambda: _task_error(OSError(errno.EIO, "I/O error")), 3),
    ("RayTaskError(QueryError)", lambda: _task_error(QueryError("bad query")), 2),
    ("RayTaskError(ValueError): a bug", lambda: _task_error(ValueError("a bug in a kind")), None),
    # DuckDB
    ("DuckDB read of a missing file", lambda: _real(lambda: duckdb.connect().execute(
        "SELECT * FROM read_parquet('/nonexistent/x.parquet')")), 3),
    ("DuckDB OutOfMemoryException", lambda: duckdb.OutOfMemoryException("could not allocate block of 262144 bytes"), 3),
    ("DuckDB CatalogException: a bug", lambda: _real(lambda: duckdb.connect().execute("SELECT * FROM no_such_table")), None),
    # ours
    ("StorageFault", lambda: StorageFault("/r/_state/locks", "cannot take the launch lock"), 3),
    ("StorageFailure", lambda: StorageFailure("unit x could not commit its results"), 3),
    ("SIGINT", lambda: Interrupted("SIGINT: stopped", 130), 130),
    ("SIGTERM", lambda: Interrupted("SIGTERM: stopped", 143), 143),
    ("UsageError", lambda: UsageError("bad --shape"), 2),
    # bugs keep their traceback
    ("KeyError", lambda: KeyError("a bug"), None),
    ("AssertionError", lambda: AssertionError("a bug"), None),
    ("ArrowInvalid", lambda: pa.ArrowInvalid("a schema mismatch in our code"), None),
    ("typer.Exit", lambda: typer.Exit(0), None),
]


@pytest.mark.parametrize("make,code", [(m, c) for _, m, c in CASES], ids=[name for name, _, _ in CASES])
def test_each_exception_class_has_its_exit_code_and_one_line(make: Any, code: int | None,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    exc = make()
    assert exit_code_for(exc) == code
    if code is None:
        with pytest.raises(type(exc)), user_errors():  # a bug is not translated: its traceback is shown
            raise exc
        return
    message = user_message(exc)
    assert "\n" not in message and "Traceback" not in message and 'File "' not in message
    assert len(message) < 1200
    with pytest.raises(typer.Exit) as info, user_errors():
        raise exc
    assert info.value.exit_code == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err


def test_a_library_fault_says_what_failed_and_its_type() -> None:
    assert user_message(rex.GetTimeoutError("Get timed out")).startswith("Ray failed: GetTimeoutError: Get timed out")
    assert user_message(duckdb.IOException("No files found")).startswith("DuckDB failed: IOException: No files found")
    assert user_message(OSError(errno.ENOSPC, "No space left on device")).startswith(
        "storage or network failure: OSError: [Errno 28] No space left on device")
    # a worker's fault is its own message, not Ray's wrapping (with the worker's traceback) of it
    assert user_message(_task_error(StorageFault("/r/x", "disk full"))) == "storage fault at /r/x: disk full"
    long = user_message(OSError("x" * 5000))
    assert "(5000 characters)" in long and len(long) < 700


def test_a_real_ray_task_raising_a_storage_fault_is_exit_3_in_one_line(ray_local: Any,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import ray

    @ray.remote
    def commit() -> None:
        raise StorageFault("/r/table=units/sweep=s/u.parquet", "OSError: [Errno 28] No space left on device")

    with pytest.raises(typer.Exit) as info, user_errors():
        ray.get(commit.remote())
    assert info.value.exit_code == 3
    err = capsys.readouterr().err
    assert err.strip() == "error: storage fault at /r/table=units/sweep=s/u.parquet: OSError: [Errno 28] No space left on device"


def _cli_app() -> _App:
    """A CLI with swapcheck's top-level handler and commands that raise outside ``user_errors``."""
    test_app = _App()

    @test_app.command("store")
    def store() -> None:
        open("/nonexistent-dir/x", "rb")  # noqa: SIM115 - a real OSError, outside user_errors

    @test_app.command("bug")
    def bug() -> None:
        units: dict[str, int] = {}
        units["missing"]  # noqa: B018 - a real bug

    return test_app


def test_the_top_level_handler_maps_what_escapes_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _cli_app()(["store"], prog_name="swapcheck")
    assert info.value.code == 3
    err = capsys.readouterr().err
    assert err.startswith("error: storage or network failure: FileNotFoundError: [Errno 2] No such file or directory")
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(KeyError):  # a bug: not translated (typer shows its traceback, exit 1)
        _cli_app()(["bug"], prog_name="swapcheck")


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "-v"])
def test_a_refused_object_store_is_exit_3_in_one_line_and_v_adds_the_traceback(tmp_path: Path, verbose: bool) -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    res = cli.invoke(app, [*(["-v"] if verbose else []), "query", "SELECT 1", "--results", "s3://bucket/prefix"], env=env)
    assert res.exit_code == 3, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert lines[0].startswith("error: ") and "127.0.0.1" in lines[0]
    if verbose:
        assert "Traceback" in res.output
    else:
        assert len(lines) == 1 and "Traceback" not in res.output


def test_a_read_only_results_tree_is_exit_3_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(tiny_spec_text(name="readonly"))
    res = cli.invoke(app, ["sweep", "launch", str(spec), "--results", "/proc/swapcheck-results", "--no-progress"])
    assert res.exit_code == 3, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "/proc/swapcheck-results" in errors[0] and "Traceback" not in res.output


# -- labels that reach terminals and tables ------------------------------------------------------

KDEPTH = """
question = "q?"
name = "labels"

[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = ["int8-cutlass-order", {{ kernel = "int8-triton-order", label = "{label}" }}]
m = 16
n = 24
k = 64
seeds = 1
"""


@pytest.mark.parametrize("label,shown", [
    ("fast\\nx", "U+000A"),
    ("fast\\r", "U+000D"),
    ("\\u001b[2Jcleared", "U+001B"),
    ("a\\u0000b", "U+0000"),
    ("a\\tb", "U+0009"),
    ("del\\u007f", "U+007F"),
    ("\\u202eevil", "U+202E"),  # right-to-left override: reorders what a terminal shows
    ("line\\u2028sep", "U+2028"),
], ids=["newline", "return", "escape", "nul", "tab", "del", "rtl-override", "line-separator"])
def test_kernel_labels_refuse_control_characters(label: str, shown: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(KDEPTH.format(label=label), "spec.toml")
    message = str(info.value)
    assert "experiments.int8.implementations[1].label" in message and shown in message, message
    assert not any(ord(c) < 32 and c != "\n" for c in message) and "\u202e" not in message


def test_a_long_label_is_refused_and_a_plain_one_passes() -> None:
    with pytest.raises(SpecError, match=r"implementations\[1\]\.label: a label is at most 128 characters"):
        parse_spec(KDEPTH.format(label="x" * 129), "spec.toml")
    assert parse_spec(KDEPTH.format(label="fast accum (sm90)"), "spec.toml").experiments["int8"]


def test_quantizer_labels_and_parameter_keys_refuse_control_characters() -> None:
    quantize = """
question = "q?"
name = "labels"

[experiments.q]
kind = "quantize"
reference = {{ quantizer = "int8-static", label = "{label}", params = {{ static_scale = 0.03125 }} }}
candidates = [{{ quantizer = "int8-static", params = {{ "{key}" = 0.03125 }} }}]
"""
    with pytest.raises(SpecError) as info:
        parse_spec(quantize.format(label="ref\\u001b]0;title\\u0007", key="static\\nscale"), "spec.toml")
    message = str(info.value)
    assert "experiments.q.reference.label" in message and "U+001B" in message
    assert "experiments.q.candidates[0].params: the key" in message


def test_a_label_with_a_control_character_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(KDEPTH.format(label="x\\u001b[2J"))
    results = tmp_path / "results"
    for cmd in (["sweep", "validate", str(spec)], ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"]):
        res = cli.invoke(app, cmd)
        assert res.exit_code == 2 and "implementations[1].label" in res.output and "\x1b" not in res.output, res.output
    assert not results.exists()


# -- environment references in path fields ---------------------------------------------------------

SECRET = "hunter2-correct-horse"  # not random-looking: only knowing it came from the environment hides it

GENERATE = """
question = "q?"
name = "paths"
{prereg}

[experiments.g]
kind = "generate"
model = "{model}"
prompts = {{ file = "{prompts}" }}
arms = {{ a = {{ kernel = "int8-cutlass-order" }} }}
"""


def _tree(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p).encode() + (p.read_bytes() if p.is_file() else b""))
    return h.hexdigest()


@pytest.mark.parametrize("field,fields", [
    ("model", {"model": "/ckpt/${AWS_SECRET_ACCESS_KEY}/qwen3", "prompts": "prompts.txt"}),
    ("prompts.file", {"model": "tiny-qwen3", "prompts": "/data/${AWS_SECRET_ACCESS_KEY}.txt"}),
    ("prompts.file", {"model": "tiny-qwen3", "prompts": "${AWS_SECRET_ACCESS_KEY:-x}/p.txt"}),
    ("preregistration[0]", {"model": "tiny-qwen3", "prompts": "prompts.txt",
                            "prereg": 'preregistration = ["${AWS_SECRET_ACCESS_KEY}/predictions.toml"]'}),
], ids=["model", "prompts-file", "prompts-file-default", "preregistration"])
def test_a_path_field_never_echoes_an_environment_reference_or_its_value(tmp_path: Path, field: str,
                                                                        fields: dict[str, str]) -> None:
    (tmp_path / "prompts.txt").write_text("1 2 3\n")
    spec = tmp_path / "spec.toml"
    spec.write_text(GENERATE.format(prereg=fields.get("prereg", ""), model=fields["model"], prompts=fields["prompts"]))
    before = _tree(tmp_path)
    for cmd in (["sweep", "validate", str(spec)], ["sweep", "plan", str(spec)],
                ["sweep", "launch", str(spec), "--results", str(tmp_path / "results"), "--no-progress"]):
        res = cli.invoke(app, cmd, env={"AWS_SECRET_ACCESS_KEY": SECRET})
        assert res.exit_code == 2, res.output
        assert field in res.output and "not shown" in res.output, res.output
        for leak in (SECRET, "hunter2", "AWS_SECRET_ACCESS_KEY", "${"):
            assert leak not in res.output, res.output
    assert _tree(tmp_path) == before


def test_an_environment_value_is_hidden_only_where_the_spec_references_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_ROOT", "/mnt/checkpoints")
    text = GENERATE.format(prereg="", model="${CKPT_ROOT}/qwen3", prompts="prompts.txt")
    with pytest.raises(SpecError) as info:
        parse_spec(text, str(tmp_path / "spec.toml"))
    assert "/mnt/checkpoints" not in str(info.value) and "experiments.g.model" in str(info.value)
    # a value the spec does not reference is shown as it is
    with pytest.raises(SpecError) as info:
        parse_spec(GENERATE.format(prereg="", model="/mnt/checkpoints/qwen3", prompts="prompts.txt"),
                   str(tmp_path / "spec.toml"))
    assert "'/mnt/checkpoints/qwen3'" in str(info.value)


if sys.platform != "linux":  # pragma: no cover - /proc is Linux's
    test_a_read_only_results_tree_is_exit_3_in_one_line = pytest.mark.skip(  # type: ignore[assignment]
        reason="needs /proc")(test_a_read_only_results_tree_is_exit_3_in_one_line)
