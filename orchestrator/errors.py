"""Named exceptions the CLI turns into user messages (exit code 2 for bad input)."""

from __future__ import annotations


class SwapcheckError(Exception):
    """Base class of every error swapcheck reports to a user."""

    exit_code = 1


class SpecError(SwapcheckError):
    """A sweep spec is missing, unreadable or invalid. Nothing was written."""

    exit_code = 2

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: invalid sweep spec; nothing was written.\n{lines}")


class UsageError(SwapcheckError):
    """A command-line argument is invalid (bad --results, bad SQL, unknown table...)."""

    exit_code = 2


class InfrastructureError(SwapcheckError):
    """Ray could not be started or reached, the disk is full, ... (never a numerical result)."""

    exit_code = 2
