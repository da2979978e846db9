"""The nightly regression job: run a suite as a dated sweep, compare its metrics, report.

``swapcheck nightly SUITE --baseline FILE --results DIR`` launches the suite spec under the sweep name
``<name>-<UTC timestamp>``, computes its summary metrics (``reports.metrics``), compares them with the
baseline file under the declared rules and with the previous night's sweep, and writes a report in
Markdown, HTML and JSON under ``<results>/nightly/<sweep>/`` (give the results root itself, e.g.
``--results results``: ``--results results/nightly`` would put them under ``results/nightly/nightly/``).

Progress goes to ``on_event(kind, info)``: the runner's ``start``/``unit``/``end`` events, and
``nightly`` events (``info["phase"]``: ``launch`` before Ray starts, ``compare`` once every unit ran).

Exit codes: 0 nothing regressed; 1 a regression (the report names each metric, the baseline value and
today's); 2 bad input (suite, baseline) or an infrastructure failure (Ray, disk, a unit that failed to
run) — an infrastructure failure is never reported as a numerical regression.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import InfrastructureError, UsageError

if TYPE_CHECKING:
    from storage.catalog import Catalog

BASELINE_VERSION = 1


@dataclass
class NightlyOutcome:
    sweep: str
    exit_code: int
    regressions: list[dict[str, Any]] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)
    since_previous: list[dict[str, Any]] = field(default_factory=list)
    previous: str | None = None
    report_dir: str | None = None
    baseline_updated: bool = False
    baseline_created: bool = False  # --update-baseline wrote the first baseline: nothing to compare with
    metrics: int = 0  # today's metrics
    # The kernel identity of today's launches against the previous night's (identity_change): flagged in
    # the report, never a regression by itself (the metrics say whether the numbers moved).
    identity: dict[str, Any] = field(default_factory=dict)


def read_baseline(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no baseline file (create one with --update-baseline)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable JSON baseline: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise UsageError(f"{path}: metrics: expected an object of metric name -> {{value, rule}}")
    for name, m in data["metrics"].items():
        if not isinstance(m, dict) or "value" not in m or m.get("rule") not in ("exact", "rate", "max", "auc"):
            raise UsageError(f"{path}: metrics.{name}: expected {{value, rule}} with rule exact, rate, max or auc")
    return data


def previous_sweep(store: Any, base: str, current: str) -> str | None:
    earlier = [s for s in store.sweeps() if s.startswith(base + "-") and s < current]
    return max(earlier) if earlier else None


def run_nightly(suite: str | Path, baseline: str | Path, results: str | Path, *, update_baseline: bool = False,
                address: str | None = None, num_cpus: int | None = None, stamp: str | None = None,
                on_event: Any = None) -> NightlyOutcome:
    from orchestrator.runner import launch
    from orchestrator.spec import load_spec
    from reports.metrics import compare, sweep_metrics
    from storage.catalog import open_catalog

    spec = load_spec(suite)
    baseline_path = Path(baseline)
    base = None if update_baseline and not baseline_path.exists() else read_baseline(baseline_path)
    stamp = stamp or datetime.utcnow().strftime("%Y%m%dT%H%M%S%f")
    dated = f"{spec.sweep.name}-{stamp}"
    spec = spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"name": dated})})
    emit = on_event or (lambda kind, info: None)
    emit("nightly", {"phase": "launch", "sweep": dated})
    summary = launch(spec, results, address=address, num_cpus=num_cpus, on_event=on_event)
    if summary.n_failed:
        first = summary.failures[0] if summary.failures else ("?", "?")
        raise InfrastructureError(
            f"{summary.n_failed} unit(s) of {dated} failed to run (e.g. {first[0]}: {first[1]}); "
            "the nightly comparison needs every unit: see `swapcheck report units`")
    emit("nightly", {"phase": "compare", "sweep": dated})
    with open_catalog(results) as cat:
        damaged = [w for w in cat.warnings if f"sweep={dated}/" in w]
        if damaged:
            # Today's metrics would be computed from fewer rows than were committed: never compare them.
            raise InfrastructureError(
                f"{len(damaged)} committed file(s) of {dated} are damaged or missing, e.g. {damaged[0]}; "
                "the nightly comparison needs every row: run `swapcheck sweep verify`, then "
                "`swapcheck sweep launch --repair`")
        today = sweep_metrics(cat, dated)
        outcome = NightlyOutcome(sweep=dated, exit_code=0, baseline_created=base is None, metrics=len(today))
        if base is not None:
            outcome.changes = compare(base["metrics"], today)
            outcome.regressions = [c for c in outcome.changes if c["regression"]]
        prev = previous_sweep(cat.store, spec_base_name(dated), dated)
        if prev:
            outcome.previous = prev
            outcome.since_previous = compare(sweep_metrics(cat, prev), today)
        outcome.identity = identity_change(launch_identities(cat, prev) if prev else [], launch_identities(cat, dated))
        if update_baseline:
            baseline_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = baseline_path.with_name(baseline_path.name + ".tmp")
            tmp.write_text(json.dumps({"version": BASELINE_VERSION, "suite": str(suite), "sweep": dated,
                                       "created_at": datetime.utcnow().isoformat() + "Z", "metrics": today},
                                      indent=1, sort_keys=True))
            tmp.replace(baseline_path)
            outcome.baseline_updated = True
        outcome.exit_code = 1 if outcome.regressions and not update_baseline else 0
        outcome.report_dir = write_report(cat, outcome, today, base)
    return outcome


def launch_identities(cat: Catalog, sweep: str) -> list[dict[str, Any]]:
    """The kernel identity of each launch of ``sweep`` (oldest first): ``identity_sha256`` and the full
    ``identity`` record (orchestrator/provenance.py), None in a row written without them."""
    out = []
    for r in cat.named("certificate_provenance", sweep=sweep):
        p = json.loads(r["provenance_json"] or "{}")
        out.append({"launch_id": r["launch_id"], "identity_sha256": p.get("identity_sha256"),
                    "identity": p.get("identity")})
    return out


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def identity_change(previous: list[dict[str, Any]], today: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the kernel identity changed since the previous night: ``changed`` True when both nights
    recorded an identity and the last launch's hashes differ, None when either night has none (unknown,
    never a change), else False; ``fields`` names every identity field that differs (dotted path:
    previous value, today's)."""
    prev = [x for x in previous if x["identity_sha256"]]
    now = [x for x in today if x["identity_sha256"]]
    out: dict[str, Any] = {"previous": prev[-1]["identity_sha256"] if prev else None,
                           "today": now[-1]["identity_sha256"] if now else None,
                           "today_all": sorted({x["identity_sha256"] for x in now}), "changed": None, "fields": []}
    if not prev or not now:
        return out
    out["changed"] = out["previous"] != out["today"]
    if out["changed"]:
        a, b = _flat(prev[-1]["identity"] or {}), _flat(now[-1]["identity"] or {})
        out["fields"] = [{"field": k, "previous": a.get(k), "today": b.get(k)}
                         for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return out


def identity_markdown(ident: dict[str, Any]) -> str:
    """The report's kernel-identity section (Markdown)."""
    if not ident:
        return ""
    head = "\n\n## Kernel identity\n\n"
    if ident["changed"] is None:
        return head + (f"Today's identity {ident['today'] or 'not recorded'}; the previous night's "
                       f"{ident['previous'] or 'not recorded'}: no comparison.\n")
    if not ident["changed"]:
        return head + f"Unchanged since the previous night: {ident['today']}.\n"
    rows = "".join(f"| `{f['field']}` | {f['previous']} | {f['today']} |\n" for f in ident["fields"])
    return (head + f"**Changed** since the previous night: {ident['previous']} -> {ident['today']}. The same kernel "
            "names ran on a different backend, library, ISA, thread count, matmul setting, layout path or "
            "tuned tactic; a metric that moved may be this.\n\n| field | previous | today |\n|---|---|---|\n" + rows)


def spec_base_name(dated: str) -> str:
    return dated.rsplit("-", 1)[0]


def markdown(outcome: NightlyOutcome, today: dict[str, Any], base: dict[str, Any] | None) -> str:
    """The nightly report in Markdown (rendered by ``reports.render.nightly_markdown``)."""
    from reports.render import nightly_markdown

    return nightly_markdown(outcome, today, base) + identity_markdown(outcome.identity)


def write_report(cat: Catalog, outcome: NightlyOutcome, today: dict[str, Any],
                 base: dict[str, Any] | None) -> str:
    """report.md, report.json and report.html under ``nightly/<sweep>/`` of the catalog's results root
    (the only place the path is made: ``--results results`` gives ``results/nightly/<sweep>/``)."""
    from reports.render import html_document

    store = cat.store
    rel = f"nightly/{outcome.sweep}"
    md = markdown(outcome, today, base)
    store.write_text(f"{rel}/report.md", md)
    store.write_text(f"{rel}/report.json", json.dumps({
        "sweep": outcome.sweep, "exit_code": outcome.exit_code, "regressions": outcome.regressions,
        "changes": outcome.changes, "previous": outcome.previous, "since_previous": outcome.since_previous,
        "baseline_updated": outcome.baseline_updated, "baseline_created": outcome.baseline_created,
        "identity": outcome.identity, "metrics": today}, indent=1, default=str))
    where = store.write_text(f"{rel}/report.html", html_document(cat, outcome.sweep, preface_markdown=md))
    return where.rsplit("/", 1)[0]
