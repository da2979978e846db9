"""Every command has help with an example and a section in docs/cli.md; --help stays instant."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer.main

from orchestrator.cli.main import app
from tests.conftest import REPO


def _commands(group, prefix: str = "swapcheck"):
    for name, cmd in group.commands.items():
        path = f"{prefix} {name}"
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path)
        else:
            yield path, cmd


COMMANDS = list(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_command_has_help_and_docs(path: str, cmd) -> None:
    assert cmd.help and len(cmd.help.strip()) > 20
    if path != "swapcheck version":
        assert "Example:" in cmd.help, f"{path} needs an example in its help"
    assert f"## `{path}`" in (REPO / "docs" / "cli.md").read_text(), "regenerate docs/cli.md (see its header)"


def test_help_does_not_import_heavy_modules() -> None:
    code = "import sys, orchestrator.cli.main; print(sorted(m for m in ('torch','ray','transformers','vllm','duckdb','pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
