"""``swapcheck sweep verify``: check the ledger's file records against the results tree."""

from __future__ import annotations

import typer

from orchestrator.cli.common import (
    DEFAULT_RESULTS,
    FormatOpt,
    ResultsOpt,
    SweepOpt,
    TableFormat,
    emit_rows,
    err,
    plural,
    user_errors,
)


def verify(results: ResultsOpt = DEFAULT_RESULTS, sweep: SweepOpt = None, fmt: FormatOpt = TableFormat.table) -> None:
    """Check every committed unit's result files against its ledger record; exit 1 on damage.

    Finds missing, truncated, extended, rewritten (checksum), unreadable and foreign-schema files,
    row counts that differ, orphan and duplicate files (rows counted twice) and temporary files a
    killed writer left. Rows written before integrity records are listed as `unverifiable` (a
    notice: exit 0). Exit 0 when nothing is damaged, 1 with the table of problems otherwise;
    `swapcheck sweep launch --repair` recomputes exactly the damaged units (a unit whose only damage is
    its ledger file is recomputed too, and its old result files compared with the recomputation: a file
    cannot vouch for itself).

    Example: swapcheck sweep verify --results results --sweep kdepth-demo --format json
    """
    with user_errors():
        from orchestrator.errors import UsageError
        from storage.store import open_store
        from storage.verify import present_sweeps
        from storage.verify import verify as check

        store = open_store(results)
        if not store.exists():
            raise UsageError(f"--results {results}: no such directory (run `swapcheck sweep launch` first)")
        if sweep is not None and sweep not in present_sweeps(store):
            raise UsageError(f"--sweep {sweep}: no such sweep under {results}")
        problems = check(store, sweep)
    damage = [p for p in problems if p.damage]
    rows = [p.as_row() for p in problems]
    if fmt is TableFormat.table:  # the path names the sweep, table and unit: keep the terminal table narrow
        rows = [{"kind": r["kind"], "path": r["path"], "remedy": r["remedy"], "detail": r["detail"]} for r in rows]
    if problems or fmt is TableFormat.json:
        emit_rows(rows, fmt, title="integrity problems")
    if fmt is not TableFormat.json:
        recompute = {(p.sweep, p.unit_id) for p in damage if p.remedy == "recompute"}
        compare = {(p.sweep, p.unit_id) for p in damage if p.remedy == "recompute and compare"} - recompute
        summary = (f"{len(damage)} problem(s), {len(recompute) + len(compare)} damaged unit(s) "
                   f"({len(recompute)} to recompute, {len(compare)} to recompute and compare with their unvouched "
                   "result files): "
                   f"`swapcheck sweep launch SPEC --results {results} --repair` fixes them" if damage
                   else "clean: every recorded file is as committed")
        err.print(summary, highlight=False)
    if damage:
        raise typer.Exit(1)


def hint_damage(results: str, sweep: str) -> None:
    """After a relaunch that found every unit done: one warning when finished units' files are missing
    or of the wrong size (a listing, no read), so "all done" never hides damage."""
    from storage.store import open_store
    from storage.verify import quick_check

    suspects = quick_check(open_store(results), sweep)
    if suspects:
        err.print(f"[bold yellow]warning:[/] {plural(len(suspects), 'finished unit')} of {sweep} "
                  f"{'has' if len(suspects) == 1 else 'have'} files missing, of the wrong size or outside "
                  f"their partition (e.g. {suspects[0]}): run `swapcheck sweep verify --results {results} --sweep "
                  f"{sweep}`, then relaunch with --repair", highlight=False)
