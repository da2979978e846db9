"""Reads at scale: the report commands and ``query`` against hand-written DuckDB + Python over the same
files, computing the same numbers (issue #25).

Rows come from ``benchmarks/gen_rows.py`` (cached under ``--dir``). Each case runs the swapcheck
command (``python -m orchestrator.cli.main ...``) and its baseline (``benchmarks/reads_baseline.py``),
each in a fresh subprocess (``peak_rss_of``), alternately; both print their output (JSON, or CSV for
``query``) to a file. The goal is <= 1.5x, judged on the median of the pairs; ``Case.extra`` records
both sides' peak RSS.

**The same numbers.** Each baseline computes what its report computes (``reads_baseline.py``'s
docstring lists it): the agreement grid over every position either arm generated, the
first-divergence and per-position tables, the flip-risk figures with every interval by the same
library calls (exact and Wilson intervals, the seeded sequence bootstrap of the AUC, the logistic
fit), the K-depth table with its near-zero totals, the ledger summary with the units whose files
are missing or resized, the certificate's K-depth, end-to-end and flip figures with their exact
intervals and K-trends, every figure of ``report divergence`` (first divergence and its Kaplan-Meier
curve, margins with the Mann-Whitney share, TARr@N/@2N, answers where recorded, probs_diff / k3 /
mismatch KL with their bootstrap intervals and the gate, flips per p_ref bucket). After the timing, the last pair's outputs are compared number by number
(``compare``: counts exactly, floats to a relative 1e-6; the logistic coefficients and the model's
predictions to 1e-3, as the fits of the same data in another row order; the bootstrap interval to
0.02): a case whose numbers differ is printed as such, recorded with ``same_numbers: false`` and
makes the script exit 1 after writing its cases. ``report divergence``'s JSON is mapped onto the
baseline's keys (``_divergence_view``: rows keyed by sweep and arm pair, each exact interval as [k, n,
rate, interval, level]) and every number compared; a pair only one side has is a difference. ``report all``
is checked through its parts (its baseline computes them in one process, each once: agreement,
flips at 500 resamples, K-depth, the divergence figures at the report's defaults as its divergence
section computes them, the certificate); ``query`` compares the CSV text.

Cases (``--cases``, comma separated; default all ten): ``query`` (a group-by), ``agreement``,
``flips``, ``kdepth``, ``units``, ``noise-floor``, ``certificate``, ``conformance`` (the certificate's
baseline: the same numbers), ``divergence``, ``all``.

    .venv/bin/python benchmarks/bench_reads.py                      # 10M rows (default), 3 pairs per case
    .venv/bin/python benchmarks/bench_reads.py --quick              # 1M rows, 2 pairs
    .venv/bin/python benchmarks/bench_reads.py --smoke              # 20k rows, agreement and query, one pair
    .venv/bin/python benchmarks/bench_reads.py --rows 100000000     # 100M rows: agreement only, one pair
                                                                    # (minutes per side; --repeat 3 to judge)

Threads: both sides' processes inherit ``--threads`` (default 1) through the environment
(``common.apply_threads``: ``OMP_NUM_THREADS`` sizes Arrow's CPU pool, the BLAS pools of the baseline's
scikit-learn and the report's). DuckDB reads no such variable: both sides run DuckDB with its default
thread count (one per core), the same on both sides, recorded as ``duckdb_threads``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from common import (  # noqa: E402
    REPO,
    Case,
    apply_threads,
    emit,
    interleaved,
    machine,
    parser,
    peak_rss_of,
    pick,
    tier,
)

PY = sys.executable
CLI = [PY, "-m", "orchestrator.cli.main"]
GROUP_BY = "SELECT arm, prompt_index % 16 AS bucket, count(*) AS n, sum(token) AS s, avg(margin) AS m FROM generations GROUP BY ALL ORDER BY ALL"

BASELINE = [PY, str(Path(__file__).with_name("reads_baseline.py"))]
#: The goal of every case: swapcheck's command over the hand-written baseline, median of the pairs.
GOAL = 1.5
#: Tolerances of ``compare`` by key (relative, or absolute where named): fits and resampling.
LOOSE = {"intercept": 1e-3, "slope": 1e-3, "predicted_rate": 1e-3}
ABSOLUTE = {"auc_ci": 0.02}


def _close(a: float, b: float, key: str) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if key in ABSOLUTE:
        return abs(a - b) <= ABSOLUTE[key]
    return abs(a - b) <= max(LOOSE.get(key, 1e-6) * max(abs(a), abs(b)), 1e-12)


def compare(cand: Any, base: Any, path: str = "", key: str = "", out: list[str] | None = None) -> list[str]:
    """Where ``base`` (the baseline's output) differs from ``cand`` (the report's): every key of a
    baseline object must be in the report's with the same value; lists element by element."""
    out = [] if out is None else out
    if isinstance(base, dict):
        if not isinstance(cand, dict):
            out.append(f"{path}: an object in the baseline, {type(cand).__name__} in the report")
            return out
        for k, v in base.items():
            if k not in cand:
                out.append(f"{path}.{k}: missing in the report")
            else:
                compare(cand[k], v, f"{path}.{k}", k if k not in ("interval",) else key, out)
    elif isinstance(base, list):
        if not isinstance(cand, list) or len(cand) != len(base):
            out.append(f"{path}: {len(base)} items in the baseline, "
                       f"{len(cand) if isinstance(cand, list) else type(cand).__name__} in the report")
            return out
        for i, (c, b) in enumerate(zip(cand, base, strict=True)):
            compare(c, b, f"{path}[{i}]", key, out)
    elif isinstance(base, bool) or base is None or isinstance(base, str):
        if cand != base:
            out.append(f"{path}: {base!r} in the baseline, {cand!r} in the report")
    elif isinstance(base, int | float):
        if not isinstance(cand, int | float) or isinstance(cand, bool) or not _close(float(cand), float(base), key):
            out.append(f"{path}: {base!r} in the baseline, {cand!r} in the report")
    return out


def _cert_view(certs: list[dict[str, Any]]) -> dict[str, Any]:
    """The certificate's numbers keyed as the baseline keys them (kernel pair sorted, scale mode)."""
    kd: dict[str, Any] = {}
    cross: dict[str, Any] = {}
    tf: dict[str, Any] = {}
    div: dict[str, Any] = {"pairs": {}, "teacher_forced": {}}
    for c in certs:
        for sm in c["scale_modes"]:
            k = sm["kdepth"]
            if k.get("status") == "run":
                kd["|".join([*sorted((c["kernel_a"], c["kernel_b"])), sm["scale_mode"]])] = {
                    "elements": k["elements"], "differing": k["differing"], "ppm": k["ppm"],
                    "ppm_ci_low": k["ppm_ci_low"], "ppm_ci_high": k["ppm_ci_high"],
                    "per_k": [{f: p[f] for f in ("k", "elements", "differing", "max_spacing", "reference_max_spacing")}
                              for p in k["per_k"]],
                    "trend": {f: k["trend"][f] for f in ("slope", "slope_ci_low", "slope_ci_high")}}
            e = sm["end_to_end"]
            for p in e.get("arm_pairs", []) if e.get("status") == "run" else []:
                cross[f"{p['arm_a']}|{p['arm_b']}"] = {"identical": p["identical"], "total": p["total"],
                                                       "identical_ci": [p["identical_ci_low"], p["identical_ci_high"]]}
                for f in p["flips"]:
                    tf[f"{f['ref_arm']}|{f['arm']}"] = {"positions": f["positions"], "flips": f["flips"],
                                                        "flip_rate_ci": [f["flip_rate_ci_low"], f["flip_rate_ci_high"]]}
                d = p.get("divergence")
                if d and d["first_divergence"]:
                    t = d["tarr_2n"] or {"k": 0, "n": 0, "interval": None}
                    div["pairs"][f"{p['arm_a']}|{p['arm_b']}"] = {**d["first_divergence"],
                                                                 "tarr_2n": [t["k"], t["n"], t["interval"]]}
                for t in (d or {}).get("teacher_forced", []):
                    m = t["flips_p_ref_0.1_0.9"] or {"k": 0, "n": 0, "interval": None}
                    div["teacher_forced"][f"{t['ref_arm']}|{t['arm']}"] = {
                        "positions": t["positions"], "probs_diff_mean": t["probs_diff_mean"],
                        "probs_diff_max": t["probs_diff_max"], "k3_mean": t["k3_mean"], "kl_mean": t["kl_mean"],
                        **({"kl_ci": t["kl_ci"], "gate_passed": t["gate"]["passed"]} if t["kl_ci"] else {}),
                        "flips_p_ref_0.1_0.9": [m["k"], m["n"], m["interval"]]}
    return {"kdepth": kd, "cross": cross, "teacher_forced": tf, "divergence": div}


def _cp_view(r: dict[str, Any] | None) -> list[Any] | None:
    """A Clopper-Pearson object of ``report divergence`` as the baseline writes it: [k, n, rate, interval, level]."""
    return None if r is None else [r["k"], r["n"], r["rate"], r["interval"], r["level"]]


def _figure_view(f: dict[str, Any], positions: int, sequences: int) -> dict[str, Any]:
    pp = f["per_position"]
    return {"mean": f["mean_per_position"], "positions": f.get("positions", positions),
            "sequences": f.get("sequences", sequences), "interval": pp["interval"], "se": pp["se"]}


def _divergence_view(rep: dict[str, Any]) -> dict[str, Any]:
    """``report divergence``'s JSON keyed as ``reads_baseline.report_divergence`` keys it (``sweep|arm_a|arm_b``,
    ``sweep|ref_arm|arm``; exact intervals as [k, n, rate, interval, level]); the text (methods, notes) left out."""
    first = {}
    for p in rep["first_divergence"]:
        s = p["survival"]
        d = p["diverged_positions"]
        first[f"{p['sweep']}|{p['arm_a']}|{p['arm_b']}"] = {
            "sequences": p["sequences"], "last_position": p["last_position"], "diverged": p["diverged"],
            "identical": p["identical"],
            "survival": {"sequences": s["sequences"], "events": s["events"], "curve": [[c["t"], c["survival"], c["low"], c["high"]] for c in s["curve"]],
                         "quantiles": s["quantiles"]},
            "diverged_positions": None if d is None else {k: d[k] for k in ("min", "q25", "median", "q75", "max")},
            "margins": {side: {k: v for k, v in m.items()} for side, m in p["margins"].items()}}
    ta = rep["total_agreement"]
    arms = {f"{a['sweep']}|{a['arm']}": {"restarts": a["restarts"], "prompts": a["prompts"], "tarr": _cp_view(a["tarr"]),
                                          "distinct": a["distinct"]} for a in ta["arms"]}
    pairs = {f"{p['sweep']}|{p['arm_a']}|{p['arm_b']}": {
        "restarts_a": p["restarts_a"], "restarts_b": p["restarts_b"], "prompts": p["prompts"], "tarr": _cp_view(p["tarr"]),
        "incomplete_prompts": p["incomplete_prompts"], "distinct": p["distinct"]} for p in ta["pairs"]}
    ans = ta["answers"]
    answers: dict[str, Any] = {"recorded": ans["recorded"]}
    if ans["recorded"]:
        changes, skipped = {}, {}
        for c in ans.get("changes", []):
            changes[f"{c['sweep']}|{c['arm_a']}|{c['arm_b']}"] = {
                **{k: c[k] for k in ("experiment", "prompts_a", "prompts_b", "both_right", "answers_differ", "n",
                                     "a_only", "b_only", "change", "abs_change_bound", "mcnemar_p",
                                     "conditional_interval")}, "discordant": _cp_view(c["discordant"])}
        for c in ans.get("changes_skipped", []):
            skipped[f"{c['sweep']}|{c['arm_a']}|{c['arm_b']}"] = [c["experiment_a"], c["experiment_b"]]
        answers.update(
            arms={f"{a['sweep']}|{a['arm']}": {"restarts": a["restarts"], "accuracy": _cp_view(a["accuracy"]),
                                               "tara": _cp_view(a["tara"])} for a in ans["arms"]},
            pairs={f"{p['sweep']}|{p['arm_a']}|{p['arm_b']}": _cp_view(p["tara"]) for p in ans["pairs"]},
            changes=changes, changes_skipped=skipped)
    dist = {}
    for p in rep["distribution"]:
        # before the vLLM split (afa0986) every measured position had its KL: kl_positions = measured_positions
        kl_pos, kl_seq = p.get("kl_positions", p["measured_positions"]), p.get("kl_sequences", p["measured_sequences"])
        e: dict[str, Any] = {"sequences": p["sequences"], "positions": p["positions"],
                             "measured_positions": p["measured_positions"], "measured_sequences": p["measured_sequences"],
                             "kl_positions": kl_pos, "kl_sequences": kl_seq}
        if "probs_diff" in p:
            m, ms = p["measured_positions"], p["measured_sequences"]
            e["probs_diff"] = {**_figure_view(p["probs_diff"], m, ms), "max": p["probs_diff"]["max"]}
            e["k3"] = _figure_view(p["k3"], m, ms)
            if p.get("kl") is not None:
                kl = p["kl"]
                e["kl"] = {**_figure_view(kl, kl_pos, kl_seq), "max": kl["max"], "mean_per_sequence": kl["mean_per_sequence"],
                           "per_sequence_interval": kl["per_sequence"]["interval"], "per_sequence_se": kl["per_sequence"]["se"]}
            e["bootstrap"] = {k: p["bootstrap"][k] for k in ("level", "resamples", "seed", "sequences")}
            g = p["gate"]
            figure = e.get(g["metric"])
            e["gate"] = {"metric": g["metric"], "threshold": g["threshold"], "mean": g["mean"], "se": g["se"],
                         "bound": g["bound"], "passed": g["passed"],
                         "positions": g.get("positions", figure["positions"] if figure else 0),
                         "sequences": g.get("sequences", figure["sequences"] if figure else 0)}
        dist[f"{p['sweep']}|{p['ref_arm']}|{p['arm']}"] = e
    buckets = {f"{p['sweep']}|{p['ref_arm']}|{p['arm']}": {
        **{b["bucket"]: _cp_view(b) for b in p["buckets"]}, p["middle"]["bucket"]: _cp_view(p["middle"]),
        p["outside"]["bucket"]: _cp_view(p["outside"])} for p in rep["flip_buckets"]}
    return {"first_divergence": first, "tarr_arms": arms, "tarr_pairs": pairs, "answers": answers,
            "distribution": dist, "flip_buckets": buckets}


def _matrix_view(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``report conformance``'s matrix rows keyed as the baseline keys its K-depth sections."""
    return {"kdepth": {"|".join([*sorted((r["kernel_a"], r["kernel_b"])), r["scale_mode"]]): {
        "elements": r["kdepth_elements"], "differing": r["kdepth_differing"], "ppm_ci_low": r["kdepth_ppm_ci_low"],
        "ppm_ci_high": r["kdepth_ppm_ci_high"],
        "trend": {"slope": r["k_trend_slope"], "slope_ci_low": r["k_trend_slope_ci_low"],
                  "slope_ci_high": r["k_trend_slope_ci_high"]}} for r in rows if r.get("kdepth_elements")}}


def check(name: str, cand_path: Path, base_path: Path) -> tuple[int, list[str]]:
    """(values compared, differences) between the report's output and its baseline's."""
    if name == "query":
        a, b = (list(csv.reader(io.StringIO(p.read_text()))) for p in (cand_path, base_path))
        if len(a) != len(b) or not a or a[0] != b[0]:
            return sum(map(len, b)), [f"the CSV differs ({len(a)} vs {len(b)} lines; first: {a[:1]} vs {b[:1]})"]
        return sum(map(len, b)), compare([[_cell(x) for x in r] for r in a[1:]], [[_cell(x) for x in r] for r in b[1:]],
                                         "query")
    cand = json.loads(cand_path.read_text())
    base = json.loads(base_path.read_text())
    if name == "all":
        return 0, []  # checked through its parts (each baseline below is one of its parts)
    if name in ("certificate", "conformance"):
        b = base["certificate"]
        if name == "certificate":
            view, want = _cert_view(cand), {k: b[k] for k in ("kdepth", "cross", "teacher_forced", "divergence")}
            # the certificate shows only the arm pairs whose arms ran two different kernels
            want["cross"] = {k: v for k, v in want["cross"].items() if k in view["cross"]}
            want["teacher_forced"] = {k: v for k, v in want["teacher_forced"].items() if k in view["teacher_forced"]}
            want["divergence"] = {
                "pairs": {k: v for k, v in want["divergence"]["pairs"].items() if k in view["cross"]},
                "teacher_forced": {k: v for k, v in want["divergence"]["teacher_forced"].items()
                                   if k in view["divergence"]["teacher_forced"] or k in view["teacher_forced"]}}
        else:
            view = _matrix_view(cand)
            want = {"kdepth": {k: {f: v[f] for f in ("elements", "differing", "ppm_ci_low", "ppm_ci_high", "trend")}
                               for k, v in b["kdepth"].items()}}
        diffs = compare(view, want, name)
        if name == "certificate" and (not view["kdepth"] or not view["cross"]):
            diffs.append("certificate: nothing to compare (no K-depth or end-to-end section)")
        return _count(want), diffs
    if name == "divergence":
        want = base["divergence"]
        view = _divergence_view(cand)
        diffs = compare(view, want, name)
        # every pair either side has: a pair only the report shows is a difference too
        for sec in ("first_divergence", "tarr_arms", "tarr_pairs", "distribution", "flip_buckets"):
            diffs += [f"{name}.{sec}.{k}: in the report, not in the baseline" for k in view[sec] if k not in want[sec]]
        if not want["first_divergence"] or not want["distribution"]:
            diffs.append("divergence: nothing to compare (no first divergence or no teacher-forced figures)")
        return _count(want), diffs
    want = base[name]
    return _count(want), compare(cand, want, name)


def _cell(text: str) -> Any:
    """A CSV cell as a number where it is one (the two sides print floats with other digits)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _count(x: Any) -> int:
    if isinstance(x, dict):
        return sum(_count(v) for v in x.values())
    if isinstance(x, list):
        return sum(_count(v) for v in x)
    return 1


def _side(cmd: list[str], out: Path) -> tuple[float, int]:
    seconds, rss, done = peak_rss_of(cmd, stdout_path=out, cwd=str(REPO))
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, rss


def measure(name: str, candidate: list[str], baseline: list[str], repeat: int, rows: int, where: Path) -> Case:
    """``repeat`` pairs, each side in a fresh process printing to a file; then the last outputs compared."""
    rss: dict[str, list[int]] = {"candidate": [], "baseline": []}
    seconds: dict[str, list[float]] = {"candidate": [], "baseline": []}
    outputs = {side: where / f"{name.replace(' ', '_')}.{side}.out" for side in seconds}

    def run(side: str, cmd: list[str]) -> None:
        s, r = _side(cmd, outputs[side])
        seconds[side].append(s)
        rss[side].append(r)

    interleaved({"candidate": lambda: run("candidate", candidate), "baseline": lambda: run("baseline", baseline)},
                repeat=repeat, warmup=0)
    compared, diffs = check(name.removeprefix("report ").split()[0], outputs["candidate"], outputs["baseline"])
    same = not diffs
    notes = (f"same numbers: {compared:,} values compared" if compared else "checked through its parts") if same else \
        f"NUMBERS DIFFER ({len(diffs)}): " + "; ".join(diffs[:3])
    return Case(stage="reads", case=f"{name} @ {rows:,} rows", baseline="hand-written DuckDB + Python, same numbers",
                seconds=seconds["candidate"], baseline_seconds=seconds["baseline"], goal=GOAL, notes=notes,
                extra={"rows": rows, "duckdb_threads": "DuckDB's default (one per core), both sides",
                       "peak_rss_bytes": max(rss["candidate"]),
                       "baseline_peak_rss_bytes": max(rss["baseline"]),
                       "peak_rss_ratio": max(rss["candidate"]) / max(rss["baseline"]),
                       "output_bytes": {side: p.stat().st_size for side, p in outputs.items()},
                       "same_numbers": same, "values_compared": compared, "differences": diffs[:20],
                       "seconds_candidate": seconds["candidate"], "seconds_baseline": seconds["baseline"]})


#: Every case: its name in --cases, the swapcheck command's arguments, the baseline's WHAT.
CASES = {
    "query": (["query", "--format", "csv", GROUP_BY], ["query", GROUP_BY]),
    "agreement": (["report", "agreement", "--format", "json"], ["agreement"]),
    "flips": (["report", "flips", "--format", "json"], ["flips"]),
    "kdepth": (["report", "kdepth", "--format", "json"], ["kdepth"]),
    "units": (["report", "units", "--format", "json"], ["units"]),
    "noise-floor": (["report", "noise-floor", "--format", "json"], ["noise-floor"]),
    "certificate": (["report", "certificate", "--format", "json"], ["certificate"]),
    "conformance": (["report", "conformance", "--format", "json"], ["certificate"]),
    "divergence": (["report", "divergence", "--format", "json"], ["divergence"]),
    "all": (["report", "all", "--format", "json"], ["all"]),
}


def main() -> None:
    # the store, imported here: compare and check need none of it
    from gen_rows import DEFAULT_DIR, ensure_rows

    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="per-position rows (default 10M; --quick: 1M; --smoke: 20k)")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                    help="where generated rows are cached (default $SWAPCHECK_BENCH_ROWS_DIR or /tmp/swapcheck-bench-rows)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="pairs of runs per case (default 3; --quick: 2; --smoke and 100M rows: 1)")
    ap.add_argument("--cases", default=None,
                    help=f"comma-separated cases of {', '.join(CASES)} (default all; --smoke: agreement,query; "
                         "100M rows and more: agreement)")
    args = ap.parse_args()
    rows = args.rows or pick(args, 10_000_000, 1_000_000, 20_000)
    huge = rows >= 100_000_000
    repeat = args.repeat or (1 if huge else pick(args, 3, 2, 1))
    args.cases = args.cases or ("agreement,query" if tier(args) == "smoke" else "agreement" if huge else ",".join(CASES))
    wanted = [c.strip() for c in args.cases.split(",")]
    unknown = sorted(set(wanted) - set(CASES))
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    print(f"threads {apply_threads(args.threads)}", flush=True)
    root = str(ensure_rows(args.dir, rows))
    out = []
    failed = []
    with tempfile.TemporaryDirectory(prefix="swapcheck-bench-reads-") as tmp:
        for name, (cand, what) in CASES.items():
            if name not in wanted:
                continue
            label = name if name == "query" else f"report {name}"
            cmd = CLI + cand[:2] + ["--results", root] + cand[2:] if name != "query" else \
                CLI + ["query", "--results", root] + cand[1:]
            case = measure(label, cmd, [*BASELINE, root, ",".join(what[:1]), *what[1:]], repeat, rows, Path(tmp))
            out.append(case)
            if not case.extra["same_numbers"]:
                failed.append(label)
            gib = 2.0 ** 30
            print(f"{label}: median {sorted(case.seconds)[len(case.seconds) // 2]:.2f} s vs "
                  f"{sorted(case.baseline_seconds)[len(case.baseline_seconds) // 2]:.2f} s; peak RSS "
                  f"{case.extra['peak_rss_bytes'] / gib:.2f} GiB vs {case.extra['baseline_peak_rss_bytes'] / gib:.2f} GiB; "
                  f"{case.notes}", flush=True)
    for c in out:
        c.extra["machine"] = machine()
    emit(out, args.json, title=f"reads at {rows:,} per-position rows (swapcheck vs hand-written DuckDB + Python, "
                               "same numbers)")
    if failed:
        print(f"the numbers of {', '.join(failed)} differ from their baselines' (see above)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
