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


def test_a_local_ray_start_is_retried_with_backoff_then_exit_3_with_a_hint() -> None:
    """Issue #36: a Ray start that timed out on a busy machine was exit 2 (bad input), with no retry and
    no hint. Now it is tried again after 2 s, 4 s, ... and, failing every time, is a fault of the machine
    (exit 3) that says what to do."""
    from orchestrator.cluster import START_ATTEMPTS_ENV, start_attempts, with_retries
    from orchestrator.errors import RayStartFailure

    calls, pauses, failures = [], [], []

    def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("The current node timed out during startup")

    with_retries(flaky, 3, pause_s=2.0, sleep=pauses.append, on_failure=lambda e, a: failures.append(a))
    assert len(calls) == 3 and pauses == [2.0, 4.0] and failures == [1, 2]

    def never() -> None:
        raise TimeoutError("The current node timed out during startup\nmore lines")

    with pytest.raises(RayStartFailure) as info:
        with_retries(never, 2, pause_s=0.5, sleep=pauses.append)
    text = str(info.value)
    assert exit_code_for(info.value) == 3 and "in 2 attempt(s)" in text and "TimeoutError" in text
    assert "more lines" not in text and START_ATTEMPTS_ENV in text and "--address 127.0.0.1:PORT" in text
    assert start_attempts({}) == 3 and start_attempts({START_ATTEMPTS_ENV: "5"}) == 5
    with pytest.raises(UsageError, match="from 1 to 10"):
        start_attempts({START_ATTEMPTS_ENV: "0"})
