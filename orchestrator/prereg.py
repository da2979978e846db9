"""Pre-registered predictions: hashed into the sweep before any unit runs, scored after.

A prediction file (TOML, beside the spec under ``sweeps/prereg/``) states what the sweep will show::

    sweep = "replay-demo"
    [[predictions]]
    id = "pow2-identical"
    statement = "Under power-of-two scales every layer is bit-identical across the pair."
    table = "replay"
    where = "comparison = 'pair' AND scale_mode = 'pow2'"
    every = "differing = 0"            # each matching row must satisfy this ...
    label = "layer"                    # ... and a failing row is named by this column
    noun = "layers"

    [[predictions]]
    id = "rate"
    statement = "Fewer than 1e-4 of outputs differ under real scales."
    table = "replay"
    where = "comparison = 'pair' AND scale_mode = 'real'"
    aggregate = "sum(differing) < 1e-4 * sum(elements)"   # ... or one condition over all of them
    measure = "sum(differing) / sum(elements)"

``sweep launch`` records each listed file's SHA-256 and text in the ``preregistrations`` table before
any unit runs. Registered files are append-only: a file whose hash changed after registration makes
the launch fail (exit 2), and the report flags it. A change is a *new* file with
``amends = "<sha256 of the file it amends>"``; its predictions replace those with the same ``id``, and
the report marks them amended, and whether results already existed when the amendment was registered.

Registration (here) happens at launch; scoring is ``reports.predictions.score`` (``report
predictions``, ``report all``). The file model and its one parser are ``storage.prereg`` (both
layers may import storage); here a parse failure becomes a SpecError (exit 2, nothing written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError
from storage.prereg import (
    Prediction,
    PredictionFile,
    PredictionFileError,
    parse,
    registrations,
    sha256,
)

__all__ = ["Prediction", "PredictionFile", "parse_file", "plan_registration", "registrations", "sha256",
           "write_registrations"]


def parse_file(text: str, path: str) -> PredictionFile:
    """A prediction file through the one parser (``storage.prereg.parse``): SpecError naming each field (exit 2)."""
    try:
        return parse(text, path)
    except PredictionFileError as exc:
        raise SpecError(exc.path, exc.problems) from None


def _check_sql(pf: PredictionFile, path: str) -> None:
    """Run every prediction against empty typed views, so a typo fails at launch, not at report."""
    import tempfile

    from reports.predictions import evaluate
    from storage.catalog import QueryError, open_catalog
    from storage.schemas import TABLES

    problems = []
    with tempfile.TemporaryDirectory() as empty, open_catalog(empty) as cat:
        for i, p in enumerate(pf.predictions):
            if p.table not in TABLES:
                problems.append(f"predictions[{i}] ({p.id}).table: unknown table {p.table!r}; allowed: {', '.join(TABLES)}")
                continue
            try:
                evaluate(cat, pf.sweep, p)
            except QueryError as exc:
                problems.append(f"predictions[{i}] ({p.id}): {exc}")
    if problems:
        raise SpecError(path, problems)


def plan_registration(store: Any, sweep: str, paths: list[str]) -> list[dict[str, Any]]:
    """Validate the spec's prediction files against what is registered; return the rows to add.

    Raises SpecError (exit 2, nothing written) for an invalid file, a file for another sweep, an
    amendment naming an unknown hash, or a registered file whose content changed.
    """
    from storage.store import utcnow

    registered = {r["path"]: r for r in registrations(store, sweep)}
    known = {r["sha256"] for r in registered.values()}
    new: list[dict[str, Any]] = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8")
        digest = sha256(text)
        pf = parse_file(text, path)
        # A nightly run's dated sweep `<name>-<stamp>` takes its suite's predictions for `<name>`.
        if pf.sweep != sweep and not sweep.startswith(pf.sweep + "-"):
            raise SpecError(path, [f"sweep: the file pre-registers {pf.sweep!r}, but this spec's sweep is {sweep!r}"])
        if path in registered:
            if registered[path]["sha256"] != digest:
                raise SpecError(path, [
                    f"changed after it was registered (registered sha256 {registered[path]['sha256'][:12]}, "
                    f"now {digest[:12]}): registered predictions are append-only. Restore the file and put "
                    f"the change in a new file with amends = \"{registered[path]['sha256']}\""])
            continue
        if pf.amends is not None and pf.amends not in known | {r["sha256"] for r in new}:
            raise SpecError(path, [f"amends: {pf.amends[:12]}... is not the hash of a file registered for sweep {sweep!r}"])
        _check_sql(pf, path)
        new.append({"path": path, "sha256": digest, "amends": pf.amends, "registered_at": utcnow(),
                    "results_existed": bool(store.done_units(sweep)), "text": text})
    return new


def write_registrations(store: Any, sweep: str, rows: list[dict[str, Any]]) -> None:
    store.records(sweep).register(rows)
