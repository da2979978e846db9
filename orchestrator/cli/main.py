"""swapcheck: can kernel A replace kernel B without changing what the model computes?"""

from __future__ import annotations

import signal
import sys
from typing import Any

import typer

from orchestrator.cli import common, selection
from orchestrator.errors import Terminated, exit_code_for

if __name__ == "__main__":  # run as a program: build only the command it names (orchestrator/cli/selection.py)
    selection.WANTED = selection.wanted(sys.argv[1:])


class _App(typer.Typer):
    """The CLI, with the last line of defence of orchestrator.errors' table: an error with an exit code
    that escapes every command's ``user_errors`` (an option callback, the start-up, a command without
    it) is still one ``error:`` line and that code; a bug keeps its traceback (exit 1)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        previous = _stop_on_sigterm()
        try:
            return super().__call__(*args, **kwargs)
        except Terminated as term:  # outside a launch (which reports its own stop, with its count)
            common.err.print(f"error: {signal.Signals(term.signum).name}: stopped.", highlight=False, markup=False)
            if getattr(term, "hard", False):  # a DuckDB call that does not stop: do not wait for it at exit
                import os

                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(128 + term.signum)
            sys.exit(128 + term.signum)
        except Exception as exc:
            code = exit_code_for(exc)
            if code is None:
                raise
            common.report_error(exc)
            sys.exit(code)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _stop_on_sigterm() -> Any:
    """SIGTERM raises :class:`~orchestrator.errors.Terminated` in the main thread from the start of the
    command (``sweep launch`` takes over with its own handlers); the handler it replaced, or None."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    return signal.signal(signal.SIGTERM, handler)


app = _App(
    name="swapcheck",
    help=__doc__ + "\n\nStart with `swapcheck sweep launch sweeps/kdepth-demo.toml`, then `swapcheck report kdepth`."
    "\n\nColour is off when output is not a terminal and whenever NO_COLOR is set.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=True,
)


def _version() -> str:
    from importlib.metadata import version as v

    return v("swapcheck")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(_version())
        raise typer.Exit()


def set_verbosity(level: int) -> None:
    """Apply ``-q``/``-v`` to this process and to the Ray workers and engines it starts (environment)."""
    import logging
    import os

    common.verbosity = level
    os.environ["SWAPCHECK_VERBOSITY"] = {common.QUIET: "quiet", common.NORMAL: "normal", common.VERBOSE: "verbose"}[level]
    engines = {common.VERBOSE: {"VLLM_LOGGING_LEVEL": "INFO", "TRANSFORMERS_VERBOSITY": "info", "RAY_BACKEND_LOG_LEVEL": "info"},
               common.QUIET: {"VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error"}}.get(level, {})
    for var, value in engines.items():
        os.environ.setdefault(var, value)
    if level == common.VERBOSE:
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("ray").setLevel(logging.INFO)


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print swapcheck's version and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress or notes: only errors and results."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also the logs of Ray and the engines (vLLM, transformers)."),
) -> None:
    # A user's kernel named "module:attr" lives in their project: import it from the current
    # directory, as `python -m` would (Ray workers of the embedded instance run there too).
    import os
    import sys

    if quiet and verbose:
        raise typer.BadParameter("give -q or -v, not both", param_hint="'-q' / '-v'")
    set_verbosity(common.QUIET if quiet else common.VERBOSE if verbose else common.NORMAL)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _register(want: selection.Wanted | None) -> None:
    """Every command (``want`` None), or the one a program's command line names; in ``--help``'s order."""
    import importlib

    for name in selection.COMMANDS[:-1]:  # `version` is defined below
        if want is not None and want.command != name:
            continue
        module = importlib.import_module(f"orchestrator.cli.{selection.MODULES.get(name, name)}")
        group = getattr(module, "app", None)  # a group's module has its Typer; a one-command module, the function
        if isinstance(group, typer.Typer):
            app.add_typer(group, name=name)
        else:
            app.command(name)(getattr(module, name))


_register(selection.WANTED)


@app.command("version")
def version() -> None:
    """Print swapcheck's version (as `swapcheck --version` does)."""
    typer.echo(_version())


if __name__ == "__main__":  # pragma: no cover
    app()
