"""One exception tree (orchestrator.errors), translated to exit codes in one place (user_errors)."""

from __future__ import annotations

import pytest
import typer

from orchestrator.cli.common import user_errors
from orchestrator.errors import (
    InfrastructureError,
    SpecError,
    StorageError,
    SwapcheckError,
    UsageError,
    exit_code_for,
)
from storage.errors import QueryError


def test_exit_codes_of_the_tree_and_the_library_layers() -> None:
    from tasks.checks import CheckInputError
    from tasks.kernels import KernelError

    assert exit_code_for(SwapcheckError("x")) == 1
    assert exit_code_for(SpecError("s.toml", ["bad"])) == 2
    assert exit_code_for(UsageError("x")) == 2
    assert exit_code_for(InfrastructureError("x")) == 2
    assert issubclass(QueryError, StorageError)
    assert exit_code_for(QueryError("x")) == 2
    assert exit_code_for(KernelError("x")) == 2
    assert exit_code_for(CheckInputError("x")) == 2
    # Not ours: a bug (shown with its traceback), and typer's own exits pass through.
    assert exit_code_for(ValueError("x")) is None
    assert exit_code_for(RuntimeError("x")) is None
    assert exit_code_for(typer.Exit(1)) is None


def test_user_errors_prints_the_message_and_exits_with_its_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as info, user_errors():
        raise QueryError("the query is empty [sic]")
    assert info.value.exit_code == 2
    assert "error: the query is empty [sic]" in capsys.readouterr().err
    with pytest.raises(typer.Exit) as info, user_errors():
        raise SwapcheckError("something")
    assert info.value.exit_code == 1
    with pytest.raises(KeyError), user_errors():
        raise KeyError("a bug")
    with pytest.raises(typer.Exit) as info, user_errors():
        raise typer.Exit(0)
    assert info.value.exit_code == 0
