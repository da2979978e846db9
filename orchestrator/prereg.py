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
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.errors import SpecError


class Prediction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: str = Field(min_length=1)
    statement: str = Field(min_length=1)
    table: str
    where: str = "true"
    every: str | None = None
    aggregate: str | None = None
    measure: str | None = None
    label: str | None = None
    noun: str = "rows"

    @model_validator(mode="after")
    def _one_test(self) -> Prediction:
        if (self.every is None) == (self.aggregate is None):
            raise ValueError("give exactly one of `every` (each matching row) or `aggregate` (all of them)")
        return self


class PredictionFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    sweep: str
    description: str | None = None
    author: str | None = None
    amends: str | None = None
    predictions: list[Prediction] = Field(min_length=1)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_file(text: str, path: str) -> PredictionFile:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path, [f"not valid TOML: {exc}"]) from None
    try:
        pf = PredictionFile.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(path, [f"{'.'.join(str(p) for p in e['loc']) or '<top level>'}: {e['msg']}"
                               for e in exc.errors(include_url=False)]) from None
    ids = [p.id for p in pf.predictions]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SpecError(path, [f"predictions: duplicate ids {dupes}"])
    return pf


def _check_sql(pf: PredictionFile, path: str) -> None:
    """Run every prediction against empty typed views, so a typo fails at launch, not at report."""
    import tempfile

    from storage.catalog import QueryError
    from storage.schemas import TABLES

    problems = []
    with tempfile.TemporaryDirectory() as empty:
        for i, p in enumerate(pf.predictions):
            if p.table not in TABLES:
                problems.append(f"predictions[{i}] ({p.id}).table: unknown table {p.table!r}; allowed: {', '.join(TABLES)}")
                continue
            try:
                evaluate(empty, pf.sweep, p)
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


def registrations(store: Any, sweep: str) -> list[dict[str, Any]]:
    rows = [r for p in store.parquet_files("preregistrations", sweep) for r in store.read_table(p).to_pylist()]
    return sorted(rows, key=lambda r: r["registered_at"])


def write_registrations(store: Any, sweep: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        store.write("preregistrations", sweep, row["sha256"][:20], [row])


def evaluate(results: str | Path, sweep: str, p: Prediction) -> dict[str, Any]:
    """Score one prediction over the sweep's rows (read-only DuckDB)."""
    from storage.catalog import read_only_query

    scope = f"FROM {p.table} WHERE sweep = '{sweep.replace(chr(39), '')}' AND ({p.where})"
    out: dict[str, Any] = {"counterexample": None, "measured": None}
    if p.every is not None:
        row = read_only_query(results, f"SELECT count(*) AS n, count(*) FILTER (WHERE coalesce(({p.every}), false)) AS k {scope}").to_pylist()[0]
        n, k = int(row["n"]), int(row["k"])
        out.update(status="confirmed" if n > 0 and k == n else "refuted", support=f"{k}/{n}", matched=n)
        if k < n:
            label = p.label or "unit_id"
            bad = read_only_query(results, f"SELECT {label} AS label {scope} AND NOT coalesce(({p.every}), false) ORDER BY 1 LIMIT 1").to_pylist()
            out["counterexample"] = str(bad[0]["label"]) if bad else None
    else:
        measure = f", ({p.measure}) AS measured" if p.measure else ""
        row = read_only_query(results, f"SELECT count(*) AS n, coalesce(({p.aggregate}), false) AS ok{measure} {scope}").to_pylist()[0]
        n = int(row["n"])
        ok = bool(row["ok"]) and n > 0
        out.update(status="confirmed" if ok else "refuted", support=f"{'holds' if ok else 'fails'} over {n}", matched=n,
                   measured=row.get("measured"))
    return out


def score(results: str | Path, store: Any, sweep: str) -> list[dict[str, Any]]:
    """One row per prediction in force (amendments replace earlier predictions with the same id)."""
    in_force: dict[str, dict[str, Any]] = {}
    for reg in registrations(store, sweep):
        pf = parse_file(reg["text"], reg["path"])
        on_disk = Path(reg["path"])
        edited = on_disk.is_file() and sha256(on_disk.read_text(encoding="utf-8")) != reg["sha256"]
        for p in pf.predictions:
            amended = p.id in in_force or pf.amends is not None
            in_force[p.id] = {
                "prediction": p.id, "statement": p.statement, "p": p, "file": reg["path"],
                "sha256": reg["sha256"], "amended": amended,
                "amended_after_results": bool(amended and reg["results_existed"]),
                "file_edited_after_registration": edited,
            }
    rows = []
    for entry in in_force.values():
        p = entry.pop("p")
        result = evaluate(results, sweep, p)
        rows.append({"sweep": sweep, **entry, **result, "noun": p.noun if p.every is not None else None})
    return rows
