"""``gc_probe``: a kind for the group-commit tests (tests/test_group_commit.py,
tests/faults/test_group_commit_faults.py).

Each unit sleeps ``seconds`` (0: returns at once, a tiny unit) and writes one row. The experiment
names units that raise (``fail``: a failed ledger row), units interrupted inside a library that
wraps the interrupt (``interrupt``: a cancel, never a failed row) and units that SIGKILL their own worker
process (``kill``: the first time only, with a marker file under ``kill_dir``; ``kill_always``: every
time). ``fresh_process`` makes every unit a cold restart. Registered (kind and table) on import;
Ray workers import it by reference (``tests._group_commit_kind:KIND``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field

from storage.schemas import register_table
from tasks.kinds import Kind, KindError, get_kind, register_kind
from tasks.kinds.base import Unit, UnitContext
from tasks.kinds.fields import Strict

TABLE = "gc_probe"
SCHEMA = register_table(TABLE, pa.schema([("unit_id", pa.string()), ("experiment", pa.string()), ("i", pa.int64()),
                                          ("slept_s", pa.float64())]))


class ProbeExperiment(Strict):
    """``units`` units that sleep ``seconds`` each and write one row."""

    kind: Literal["gc_probe"]
    units: int = Field(ge=1)
    seconds: float = Field(default=0.0, ge=0)
    fail: list[int] = []
    kill: list[int] = []
    kill_always: list[int] = []
    kill_dir: str = ""
    interrupt: list[int] = []
    fresh_process: bool = False


def _expand(experiment: str, exp: ProbeExperiment) -> list[Unit]:
    def params(i: int) -> dict[str, Any]:
        p: dict[str, Any] = {"i": i, "seconds": exp.seconds}
        if i in exp.fail:
            p["fail"] = True
        if i in exp.kill:
            p["kill_marker"] = str(Path(exp.kill_dir) / f"killed-{i}")
        if i in exp.kill_always:
            p["kill_always"] = True
        if i in exp.interrupt:
            p["interrupt"] = True
        return p

    return [KIND.unit(experiment, params(i), fresh_process=exp.fresh_process) for i in range(exp.units)]


def _run(params: dict[str, Any], ctx: UnitContext | None = None) -> dict[str, list[dict[str, Any]]]:
    if params.get("kill_always"):
        os.kill(os.getpid(), signal.SIGKILL)
    marker = params.get("kill_marker")
    if marker and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)  # this worker, mid-batch
    if params["seconds"]:
        time.sleep(params["seconds"])
    if params.get("fail"):
        raise RuntimeError(f"planted failure of unit {params['i']}")
    if params.get("interrupt"):  # a cancel landing inside a library that wraps it (pydantic does)
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error building validator: KeyboardInterrupt: ") from exc
    return {TABLE: [{"i": params["i"], "slept_s": params["seconds"]}]}


KIND = Kind(name="gc_probe", version="1", spec=ProbeExperiment, tables=(TABLE,), describe=lambda p: f"gc probe {p['i']}",
            run=_run, expand=_expand)


def register() -> None:
    """Register the kind in this (driver) process, by reference so Ray workers find it too."""
    try:
        get_kind("gc_probe")
    except KindError:
        register_kind("tests._group_commit_kind:KIND", name="gc_probe")


def unregister() -> None:
    """Take the kind out of this process's registry again (other tests list every kind)."""
    from tasks.kinds import unregister_kind

    try:
        get_kind("gc_probe")
    except KindError:
        return
    unregister_kind("gc_probe")


@contextmanager
def registered() -> Iterator[None]:
    """The kind registered for the duration (the tests' fixture)."""
    register()
    try:
        yield
    finally:
        unregister()


def spec_text(name: str, units: int, seconds: float = 0.0, max_retries: int | None = None, **lists: Any) -> str:
    """A sweep of ``units`` gc_probe units (``fail=[...]``, ``kill=[...]``, ``kill_dir=...``, ...)."""
    extra = "".join(f"{k} = {v!r}\n" if not isinstance(v, bool) else f"{k} = {str(v).lower()}\n" for k, v in lists.items())
    retries = f"max_retries = {max_retries}\n" if max_retries is not None else ""
    return (f'question = "Does a group commit lose or duplicate nothing?"\nname = "{name}"\n{retries}\n'
            f'[experiments.p]\nkind = "gc_probe"\nunits = {units}\nseconds = {seconds}\n{extra}')
