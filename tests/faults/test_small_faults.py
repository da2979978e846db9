"""The smaller faults of issue #24 (item 7): each a clear exit 2 naming the file and the field, nothing changed.

- ``swapcheck db --out`` never replaces a file it did not write (unless ``--force``) and never writes
  inside the results tree;
- a spec error echoes at most a bounded excerpt of the offending value;
- names that become paths refuse control characters and newlines;
- values that look like secrets or environment references are never echoed;
- a replay artifact with a wrong operand dtype is bad input (exit 2), naming the file and the field;
- a relaunch over damaged files that has nothing to run says how to repair.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import launch_in_process, tiny_spec_text

cli = CliRunner()


def tree_hash(root: Path) -> str:
    """SHA-256 over every path and every file's bytes under ``root``."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small results tree: one sweep launched in-process, its six units committed."""
    root = tmp_path_factory.mktemp("small") / "results"
    summary = launch_in_process(root, tiny_spec_text(name="small-faults", seeds=1))
    assert summary.n_ok == summary.n_units == 6, summary.failures
    return root


# -- a. swapcheck db --out -------------------------------------------------------------------------

@pytest.mark.parametrize("name,content", [
    ("README.md", b"# my notes\n"),
    ("notes.sql", b"SELECT 1;\n"),
    ("data.duckdb", b"not a database at all, but named like one\n"),
])
def test_db_refuses_to_overwrite_a_foreign_file(results: Path, tmp_path: Path, name: str, content: bytes) -> None:
    out = tmp_path / name
    out.write_bytes(content)
    before = tree_hash(tmp_path), tree_hash(results)
    res = cli.invoke(app, ["db", "--results", str(results), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert name in res.output and "--force" in res.output and "nothing was written" in res.output
    assert (tree_hash(tmp_path), tree_hash(results)) == before
    res = cli.invoke(app, ["db", "--results", str(results), "--out", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes() != content


def test_db_refuses_a_duckdb_database_with_tables(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine.duckdb"
    con = duckdb.connect(str(out))
    con.execute("CREATE TABLE precious AS SELECT 42 AS answer")
    con.close()
    before = out.read_bytes()
    res = cli.invoke(app, ["db", "--results", str(results), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "table" in res.output and "mine.duckdb" in res.output
    assert out.read_bytes() == before


@pytest.mark.parametrize("suffix", [".duckdb", ".sql"])
def test_db_replaces_its_own_export(results: Path, tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"views{suffix}"
    for _ in range(2):
        res = cli.invoke(app, ["db", "--results", str(results), "--out", str(out)])
        assert res.exit_code == 0, res.output


@pytest.mark.parametrize("rel", ["views.duckdb", "table=kdepth/views.sql", "."])
def test_db_refuses_out_inside_the_results_tree(results: Path, rel: str) -> None:
    before = tree_hash(results)
    for force in ([], ["--force"]):
        res = cli.invoke(app, ["db", "--results", str(results), "--out", str(results / rel), *force])
        assert res.exit_code == 2, res.output
        assert tree_hash(results) == before
        if rel != ".":  # a directory is refused by the option itself
            assert "inside the results tree" in res.output


def test_db_help_says_what_it_replaces() -> None:
    res = cli.invoke(app, ["db", "--help"], terminal_width=200)
    assert "--force" in res.output and "replaced only" in res.output


# -- b, c, d. what a spec error echoes; names that become paths --------------------------------------

HEAD = 'question = "q?"\nname = "small-faults"\n'
KDEPTH = HEAD + """
[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = ["int8-cutlass-order", "int8-triton-order"]
m = 16
n = 24
seeds = 1
"""


def _refused(tmp_path: Path, text: str, names: str, env: dict[str, str] | None = None) -> str:
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    results = tmp_path / "results"
    before = tree_hash(tmp_path)
    outs = []
    for cmd in (["sweep", "validate", str(spec)], ["sweep", "plan", str(spec)],
                ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"]):
        res = cli.invoke(app, cmd, env=env)
        assert res.exit_code == 2, res.output
        assert "spec.toml" in res.output and names in res.output and "nothing was written" in res.output, res.output
        outs.append(res.output)
    assert tree_hash(tmp_path) == before and not results.exists()
    return "\n".join(outs)


@pytest.mark.slow  # slow set: the default run stays under 6 minutes on 2 cores (CI runs both)
def test_a_huge_list_is_echoed_as_a_bounded_excerpt(tmp_path: Path) -> None:
    out = _refused(tmp_path, KDEPTH + "k = [" + ", ".join(["64"] * 300_000) + "]\n", "experiments.int8.k")
    assert "(300000 values)" in out
    assert len(out) < 3 * 2000, len(out)


def test_a_huge_string_is_echoed_as_a_bounded_excerpt(tmp_path: Path) -> None:
    out = _refused(tmp_path, KDEPTH + "k = 64\nreference = \"" + "x" * 1_000_000 + "\"\n", "experiments.int8")
    assert len(out) < 3 * 2500, len(out)


@pytest.mark.parametrize("line,names", [
    ('name = "x\\n"', "name: "),
    ('name = "x\\r"', "name: "),
    ('name = "x\\u0000y"', "name: "),
    ('name = "a\\tb"', "name: "),
])
def test_sweep_names_refuse_control_characters(tmp_path: Path, line: str, names: str) -> None:
    out = _refused(tmp_path, KDEPTH.replace('name = "small-faults"', line) + "k = 64\n", names)
    assert "control character" in out


@pytest.mark.parametrize("key,code", [("a\\nb", "U+000A"), ("a\\u202Eb", "U+202E"), ("a\\u2028b", "U+2028")])
def test_experiment_names_refuse_control_characters(tmp_path: Path, key: str, code: str) -> None:
    """A newline, a right-to-left override or a line separator in an experiment's name: refused like
    every other key (issue #36: the override was accepted and printed raw), the character named."""
    out = _refused(tmp_path, KDEPTH.replace("[experiments.int8]", f'[experiments."{key}"]') + "k = 64\n", "experiments")
    assert "control character" in out and code in out and "\u202e" not in out


SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize("extra,names", [
    ('reference = "${AWS_SECRET_ACCESS_KEY}"', "experiments.int8.reference"),
    ('reference = "$AWS_SECRET_ACCESS_KEY"', "experiments.int8.reference"),
    ('bogus = "${AWS_SECRET_ACCESS_KEY}"', "experiments.int8.bogus"),
    (f'bogus = "{SECRET}"', "experiments.int8.bogus"),
    ('bogus = "AKIAIOSFODNN7EXAMPLE"', "experiments.int8.bogus"),
    ('api_key = "hunter2"', "experiments.int8.api_key"),
    ('password = ["hunter2"]', "experiments.int8.password"),
    ('implementations = ["int8-cutlass-order", "${AWS_SECRET_ACCESS_KEY}"]', "experiments.int8.implementations[1]"),
    ('m = "${AWS_SECRET_ACCESS_KEY}"', "experiments.int8.m"),
])
def test_secrets_and_environment_references_are_never_echoed(tmp_path: Path, extra: str, names: str) -> None:
    text = KDEPTH.replace("m = 16\n", "") if extra.startswith("m =") else KDEPTH
    text = text.replace('implementations = ["int8-cutlass-order", "int8-triton-order"]\n', "") \
        if extra.startswith("implementations") else text
    out = _refused(tmp_path, text + "k = 64\n" + extra + "\n", names,
                   env={"AWS_SECRET_ACCESS_KEY": SECRET})
    for leak in ("AWS_SECRET_ACCESS_KEY", SECRET, "AKIAIOSFODNN7EXAMPLE", "hunter2", "${"):
        assert leak not in out, out
    assert "not shown" in out


def test_the_sweep_name_is_never_echoed_when_it_is_an_environment_reference(tmp_path: Path) -> None:
    out = _refused(tmp_path, KDEPTH.replace('name = "small-faults"', 'name = "${AWS_SECRET_ACCESS_KEY}"') + "k = 64\n",
                   "name: ")
    assert "AWS_SECRET" not in out and "not shown" in out


# -- e. a replay artifact with a wrong operand dtype -------------------------------------------------

@pytest.mark.parametrize("a_dtype,b_dtype,names", [
    ("float64", "float64", "tensors.a: dtype float64"),
    ("float32", "int64", "tensors.b: dtype int64"),
    ("int8", "float32", "tensors.a / b: dtypes differ"),
])
def test_replay_refuses_an_artifact_with_a_wrong_operand_dtype(tmp_path: Path, a_dtype: str, b_dtype: str, names: str) -> None:
    import json

    import torch
    from safetensors.torch import save_file

    from tasks.checks.artifact import FORMAT, FORMAT_VERSION

    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "kernel": {"ref": "int8-cutlass-order", "params": {}},
            "check": {"name": "exact_match", "dtype": "fp32", "info": {}},
            "shape": {"m": 2, "k": 3, "n": 2}, "seed": 0, "trial": 0, "verdict": "INCORRECT"}  # fmt: skip
    path = tmp_path / "bad.safetensors"
    save_file({"a": torch.zeros(2, 3, dtype=getattr(torch, a_dtype)), "b": torch.zeros(3, 2, dtype=getattr(torch, b_dtype))},
              str(path), metadata={"swapcheck": json.dumps(meta)})
    before = tree_hash(tmp_path)
    res = cli.invoke(app, ["check", "replay", str(path)])
    assert res.exit_code == 2, res.output
    assert "bad.safetensors" in res.output and names in res.output, res.output
    assert tree_hash(tmp_path) == before
