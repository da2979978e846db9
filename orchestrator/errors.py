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
``storage.errors.StorageFault``        3          the results tree could not be read or written
                                                  (permission, disk full, store unreachable)
=====================================  =========  =========================================================

The libraries below raise their own types; a fault of storage or infrastructure that reaches a user
is classified here by its type (:func:`foreign_exit_code`), never by its message, and shown as one
line (:func:`user_message`; ``swapcheck -v`` adds the library's whole traceback):

- exit 3, ``OSError`` (pyarrow's ``ArrowIOError`` is one, so are ``TimeoutError`` and
  ``ConnectionError``): a file system, object store or network call failed (a missing bucket, a
  refused endpoint, a read-only file system, a full disk, no HDFS library);
- exit 3, ``ray.exceptions.RayError`` (``RaySystemError``, ``GetTimeoutError``, ``WorkerCrashedError``,
  ``ObjectLostError``, ``NodeDiedError``, ``OutOfMemoryError``, ...): Ray failed. A ``RayTaskError``
  is classified by its cause: ``RayTaskError(StorageFault)`` is 3, a worker's bug stays a bug;
- exit 3, ``duckdb.IOException`` (``HTTPException``), ``OutOfMemoryException``, ``ConnectionException``:
  DuckDB could not read, allocate or connect;
- anything else: not translated, a bug, shown with its traceback (exit 1).

Exit codes of a command, in short: 0 it ran and what it judged passed; 1 a result failed (a check's
verdict, a nightly regression) or an unexpected error; 2 bad input or broken infrastructure, nothing
judged; 3 a storage or infrastructure fault (the results store failed during a sweep; a file system,
object store, network, Ray or DuckDB failure); 130 / 143 interrupted by SIGINT / SIGTERM.
"""

from __future__ import annotations

import sys

from storage.errors import StorageError, StorageFault
from swapcheck_common.errors import InputError

__all__ = [
    "SwapcheckError",
    "SpecError",
    "UsageError",
    "InfrastructureError",
    "Interrupted",
    "StorageFailure",
    "StorageError",
    "Terminated",
    "exit_code_for",
    "foreign_exit_code",
    "user_message",
]

#: Most characters of a library's message that the one error line shows.
MAX_CAUSE = 500

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


class RayStartFailure(InfrastructureError):
    """The embedded Ray instance did not start, after every attempt (a busy machine, a full /tmp):
    a fault of this machine, not of the input (issue #36: it had been exit 2, bad input)."""

    exit_code = 3


class StorageFailure(InfrastructureError):
    """The results store failed while a sweep ran (never recorded as a unit's failure)."""

    exit_code = 3


class Interrupted(SwapcheckError):
    """SIGINT or SIGTERM stopped a launch; what was committed stays committed."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(BaseException):
    """SIGTERM (or SIGINT) raised by swapcheck's own handler in the main thread: a ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` on the way mistakes it for a fault. The CLI
    (``orchestrator.cli.main``) turns it into one line and exit 128 + the signal number; a launch turns
    it into :class:`Interrupted` with the committed count."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of an error a user should see as a message (tables above); None for a bug."""
    cause = _task_cause(exc)
    if cause is not None:  # a Ray task's exception: what it wraps decides (it is also of the cause's class)
        return exit_code_for(cause)
    if isinstance(exc, SwapcheckError):
        return exc.exit_code
    if isinstance(exc, StorageFault):  # the results tree failed: a fault of storage, not bad input
        return 3
    if isinstance(exc, InputError):  # every layer's input errors (StorageError, KernelError, ...)
        return 2
    return foreign_exit_code(exc)


def foreign_exit_code(exc: BaseException) -> int | None:
    """3 for a storage or infrastructure fault of the libraries below (second table), by type; else None.

    Ray and DuckDB are looked up among the modules already imported (an exception of theirs can only
    exist once they are), so the CLI never imports them to classify an error.
    """
    if isinstance(exc, OSError):
        return 3
    ray_exceptions = sys.modules.get("ray.exceptions")
    if ray_exceptions is not None and isinstance(exc, ray_exceptions.RayError):
        if isinstance(exc, ray_exceptions.RayTaskError):  # the task's own exception decides
            cause = _task_cause(exc)
            return exit_code_for(cause) if cause is not None else None
        return 3
    duckdb = sys.modules.get("duckdb")
    if duckdb is not None and isinstance(exc, duckdb.IOException | duckdb.OutOfMemoryException
                                         | duckdb.ConnectionException):
        return 3
    return None


def _task_cause(exc: BaseException) -> BaseException | None:
    """The exception a Ray task raised, when ``exc`` is Ray's ``RayTaskError`` wrapping it; else None."""
    ray_exceptions = sys.modules.get("ray.exceptions")
    if ray_exceptions is None or not isinstance(exc, ray_exceptions.RayTaskError):
        return None
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) and cause is not exc else None


def _origin(exc: BaseException) -> str:
    """What failed, from the exception's type: "Ray", "DuckDB" or "storage or network"."""
    module = type(exc).__module__ or ""
    if module.startswith("ray"):
        return "Ray failed"
    if module.startswith("duckdb") or module.startswith("_duckdb"):
        return "DuckDB failed"
    return "storage or network failure"


def user_message(exc: BaseException) -> str:
    """The message a user sees for ``exc``: swapcheck's own errors as written (a spec error lists its
    problems); a library's fault as one line: what failed, the type and the first line of its
    message (bounded), never a traceback (``-v`` shows it)."""
    cause = _task_cause(exc)
    if cause is not None:
        return user_message(cause)  # a worker's exception, not Ray's wrapping of it (with its traceback)
    if isinstance(exc, SwapcheckError | InputError):
        return str(exc)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if len(first) > MAX_CAUSE:
        first = first[:MAX_CAUSE] + f"… ({len(first)} characters)"
    more = " (more with swapcheck -v)" if len(lines) > 1 or len(lines[0] if lines else "") > MAX_CAUSE else ""
    return f"{_origin(exc)}: {type(exc).__name__}{': ' + first if first else ''}{more}"
