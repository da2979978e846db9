"""The one tree of errors swapcheck reports to a user, and the exit code of each.

Every command runs inside :func:`orchestrator.cli.common.user_errors`, the one place that turns an
exception into ``error: <message>`` on stderr and an exit code, through :func:`exit_code_for`.  The
library layers keep their own exception classes (``storage`` and ``tasks`` import nothing of
``orchestrator``), each a subclass of ``swapcheck_common.errors.InputError``, which :func:`exit_code_for`
maps to exit code 2 once: no command translates errors itself, and no layer is named here.

=====================================  =========  =========================================================
class                                  exit code  meaning
=====================================  =========  =========================================================
:class:`SwapcheckError`                1          base class of every error swapcheck reports to a user
:class:`SpecError`                     2          a sweep spec is missing, unreadable or invalid; nothing
                                                  was written
:class:`UsageError`                    2          a command-line argument is invalid (bad --results, bad
                                                  --shape, ...)
:class:`InfrastructureError`           2          Ray could not be started or reached, a unit cannot be
                                                  placed, ...
:class:`StorageFailure`                3          the results store failed mid-sweep (permission, disk
                                                  full, unreachable): the sweep stopped; committed units stay
:class:`Interrupted`                   130/143    SIGINT / SIGTERM stopped the launch; committed units stay
``swapcheck_common.errors.InputError``           2          bad input refused by a layer below; nothing was changed.
                                                  Its subclasses (each a ``ValueError``):
``swapcheck_common.registry.RegistryError``      2          an unknown or duplicate name in a registry (did you mean,
                                                  the allowed names); ``tasks.kinds.KindError``
``storage.errors.StorageError``        2          the storage layer refused or failed a request
                                                  (``QueryError``: a bad or failed query)
``tasks.kernels.KernelError``          2          unknown kernel, unimportable ``module:attr``, bad
                                                  parameters, a problem or operands it does not support
``tasks.attention.AttentionError``     2          unknown attention kernel, bad operands, unavailable here
``tasks.quantizers.QuantizerError``    2          unknown quantizer, bad parameter or input
``tasks.checks.CheckInputError``       2          bad input to a correctness check (shape, dtype, trials,
                                                  kernel)
anything else                          (none)     not translated: a bug, shown with its traceback (exit 1)
=====================================  =========  =========================================================

Exit codes of a command, in short: 0 it ran and what it judged passed; 1 a result failed (a check's
verdict, a nightly regression) or an unexpected error; 2 bad input or broken infrastructure, nothing
judged; 3 the results store failed during a sweep; 130 / 143 interrupted by SIGINT / SIGTERM.
"""

from __future__ import annotations

from storage.errors import StorageError
from swapcheck_common.errors import InputError

__all__ = [
    "SwapcheckError",
    "SpecError",
    "UsageError",
    "InfrastructureError",
    "Interrupted",
    "StorageFailure",
    "StorageError",
    "exit_code_for",
]

class SwapcheckError(Exception):
    """Base class of every error swapcheck reports to a user."""

    exit_code = 1


class SpecError(SwapcheckError):
    """A sweep spec is missing, unreadable or invalid. Nothing was written."""

    exit_code = 2

    def __init__(self, path: str, problems: list[str]):
        from swapcheck_common.echo import scrub

        self.path = path
        self.problems = [scrub(p) for p in problems]  # bounded, and never a value that looks like a secret
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{path}: invalid sweep spec; nothing was written.\n{lines}")


class UsageError(SwapcheckError):
    """A command-line argument is invalid (bad --results, bad SQL, unknown table...)."""

    exit_code = 2


class InfrastructureError(SwapcheckError):
    """Ray could not be started or reached, the disk is full, ... (never a numerical result)."""

    exit_code = 2


class StorageFailure(InfrastructureError):
    """The results store failed while a sweep ran (never recorded as a unit's failure)."""

    exit_code = 3


class Interrupted(SwapcheckError):
    """SIGINT or SIGTERM stopped a launch; what was committed stays committed."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of an error a user should see as a message (table above); None for a bug."""
    if isinstance(exc, SwapcheckError):
        return exc.exit_code
    if isinstance(exc, InputError):  # every layer's input errors (StorageError, KernelError, ...)
        return 2
    return None
