"""Reads at scale: the report commands against hand-written DuckDB over the same files.

Rows come from ``benchmarks/gen_rows.py`` (cached under ``--dir``). Each case runs the swapcheck
command (``python -m orchestrator.cli.main ...``) and its baseline, each in a fresh subprocess
(``peak_rss_of``), alternately; ``Case.extra`` records both sides' peak RSS. The baselines read the
same Parquet files with DuckDB's own ``read_parquet`` (no catalog, no ledger checks) and compute the
same table: agreement (self-reproducibility, cross-arm, first divergence, per-position agreement),
flips (per pair: counts, exact interval, ROC-AUC and a logistic fit with scikit-learn, decade
calibration, 90% flip margin), the K-depth summary, all of those for ``report all``, and a group-by
for ``query``.

    .venv/bin/python benchmarks/bench_reads.py                      # 10M rows (default)
    .venv/bin/python benchmarks/bench_reads.py --quick              # 1M rows
    .venv/bin/python benchmarks/bench_reads.py --rows 100000000     # 100M rows
    .venv/bin/python benchmarks/bench_reads.py --smoke              # 20k rows, agreement and query, one pair

Threads: both sides' processes inherit ``--threads`` (default 1) through the environment
(``common.apply_threads``: ``OMP_NUM_THREADS`` sizes Arrow's CPU pool, the BLAS pools of the baseline's
scikit-learn and the report's). DuckDB reads no such variable: both sides run DuckDB with its default
thread count (one per core), the same on both sides, recorded as ``duckdb_threads``.
"""

from __future__ import annotations

import sys
from pathlib import Path

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
from gen_rows import DEFAULT_DIR, ensure_rows  # noqa: E402

PY = sys.executable
CLI = [PY, "-m", "orchestrator.cli.main"]
GROUP_BY = "SELECT arm, prompt_index % 16 AS bucket, count(*) AS n, sum(token) AS s, avg(margin) AS m FROM generations GROUP BY ALL"

#: The hand-written baselines: one Python program, run with the results root and which tables to make.
BASELINE = r'''
import glob, sys
import duckdb
root, what = sys.argv[1], sys.argv[2].split(",")
con = duckdb.connect()
def view(t):
    files = sorted(glob.glob(f"{root}/table={t}/sweep=*/*.parquet"))
    con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet({files!r}, hive_partitioning = true)")
for t in ("generations", "sequences", "arm_runs", "teacher_forced", "kdepth"):
    view(t)
out = []
if "agreement" in what:
    out.append(con.sql("""
        SELECT sweep, arm, count(DISTINCT restart) AS restarts,
               count(*) FILTER (WHERE same) AS identical, count(*) AS total
        FROM (SELECT sweep, arm, prompt_index, count(DISTINCT sequence_hash) = 1 AS same
              FROM sequences GROUP BY ALL)
        JOIN (SELECT sweep, arm, count(DISTINCT restart) AS restart FROM sequences GROUP BY ALL) USING (sweep, arm)
        GROUP BY sweep, arm""").fetchall())
    con.execute("""CREATE TEMP VIEW g AS SELECT sweep, arm, prompt_index, position, token, margin
                   FROM generations WHERE restart = 0""")
    con.execute("""CREATE TEMP VIEW c AS SELECT x.sweep, x.arm AS a, y.arm AS b, x.prompt_index, x.position,
                   x.token AS ta, y.token AS tb, x.margin AS ma, y.margin AS mb, x.token <> y.token AS differs
                   FROM g x JOIN g y ON x.sweep = y.sweep AND x.prompt_index = y.prompt_index
                   AND x.position = y.position AND x.arm < y.arm""")
    out.append(con.sql("""
        SELECT x.sweep, x.arm, y.arm, count(*) FILTER (WHERE x.sequence_hash = y.sequence_hash), count(*)
        FROM sequences x JOIN sequences y ON x.sweep = y.sweep AND x.prompt_index = y.prompt_index AND x.arm < y.arm
        WHERE x.restart = 0 AND y.restart = 0 GROUP BY ALL""").fetchall())
    out.append(con.sql("""
        SELECT sweep, a, b, prompt_index, count(*), min(position) FILTER (WHERE differs),
               arg_min(ta, position) FILTER (WHERE differs), arg_min(tb, position) FILTER (WHERE differs),
               arg_min(ma, position) FILTER (WHERE differs), arg_min(mb, position) FILTER (WHERE differs)
        FROM c GROUP BY ALL ORDER BY ALL""").fetchall())
    out.append(con.sql("""
        WITH f AS (SELECT sweep, a, b, prompt_index, min(position) FILTER (WHERE differs) AS fd FROM c GROUP BY ALL)
        SELECT sweep, a, b, position, count(*), count(*) FILTER (WHERE NOT differs),
               count(*) FILTER (WHERE fd IS NULL OR fd > position)
        FROM c JOIN f USING (sweep, a, b, prompt_index) GROUP BY ALL ORDER BY ALL""").fetchall())
if "kdepth" in what:
    out.append(con.sql("""
        SELECT sweep, dtype, out_dtype, comparison, impl_a, impl_b, scale_mode, k, count(DISTINCT seed),
               sum(elements), sum(differing), max(max_spacing), sum(hist_1), sum(hist_2), sum(hist_gt2)
        FROM kdepth GROUP BY ALL ORDER BY ALL""").fetchall())
if "flips" in what:
    import numpy as np
    from scipy.stats import binomtest
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    pairs = con.sql("SELECT DISTINCT sweep, ref_arm, arm FROM teacher_forced ORDER BY ALL").fetchall()
    for sweep, ref, arm in pairs:
        m, f = con.execute("SELECT ref_margin, flip FROM teacher_forced WHERE sweep = ? AND ref_arm = ? AND arm = ?",
                           [sweep, ref, arm]).fetchnumpy().values()
        m, f = np.asarray(m, dtype=np.float64), np.asarray(f, dtype=bool)
        k, n = int(f.sum()), f.size
        row = [sweep, ref, arm, n, k, binomtest(k, n).proportion_ci(method="exact")]
        if 0 < k < n:
            x = np.log10(m + 1e-7)
            row.append(roc_auc_score(f, -m))
            row.append(LogisticRegression(C=1.0, max_iter=1000).fit(((x - x.mean()) / x.std())[:, None], f).coef_)
            row.append(np.quantile(m[f], 0.9, method="inverted_cdf"))
        edges = np.array([0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, np.inf])
        b = np.searchsorted(edges, m, side="right") - 1
        row.append((np.bincount(b, minlength=10), np.bincount(b, weights=f, minlength=10)))
        out.append(row)
if "query" in what:
    out.append(con.sql(sys.argv[3]).fetchall())
print(len(out))
'''


def _side(cmd: list[str]) -> tuple[float, int]:
    seconds, rss, done = peak_rss_of(cmd, cwd=str(REPO))
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, rss


def measure(name: str, candidate: list[str], baseline: list[str], repeat: int, rows: int) -> Case:
    rss: dict[str, list[int]] = {"candidate": [], "baseline": []}
    seconds: dict[str, list[float]] = {"candidate": [], "baseline": []}

    def run(side: str, cmd: list[str]) -> None:
        s, r = _side(cmd)
        seconds[side].append(s)
        rss[side].append(r)

    interleaved({"candidate": lambda: run("candidate", candidate), "baseline": lambda: run("baseline", baseline)},
                repeat=repeat, warmup=0)
    return Case(stage="reads", case=f"{name} @ {rows:,} rows", baseline="hand-written DuckDB over the same files",
                seconds=seconds["candidate"], baseline_seconds=seconds["baseline"], goal=1.25,
                extra={"rows": rows, "duckdb_threads": "DuckDB's default (one per core), both sides",
                       "peak_rss_bytes": max(rss["candidate"]),
                       "baseline_peak_rss_bytes": max(rss["baseline"]),
                       "peak_rss_ratio": max(rss["candidate"]) / max(rss["baseline"]),
                       "seconds_candidate": seconds["candidate"], "seconds_baseline": seconds["baseline"]})


def main() -> None:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="per-position rows (default 10M; --quick: 1M; --smoke: 20k)")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                    help="where generated rows are cached (default $SWAPCHECK_BENCH_ROWS_DIR or /tmp/swapcheck-bench-rows)")
    ap.add_argument("--repeat", type=int, default=None, help="pairs of runs per case (default 3; --quick: 2; --smoke: 1)")
    ap.add_argument("--cases", default=None, help="comma-separated cases (default all five; --smoke: agreement,query)")
    args = ap.parse_args()
    rows = args.rows or pick(args, 10_000_000, 1_000_000, 20_000)
    repeat = args.repeat or pick(args, 3, 2, 1)
    args.cases = args.cases or ("agreement,query" if tier(args) == "smoke" else "agreement,flips,kdepth,all,query")
    print(f"threads {apply_threads(args.threads)}", flush=True)
    root = str(ensure_rows(args.dir, rows))
    base = [PY, "-c", BASELINE, root]
    cases = {
        "report agreement": (CLI + ["report", "agreement", "--results", root, "--format", "json"], base + ["agreement"]),
        "report flips": (CLI + ["report", "flips", "--results", root, "--format", "json"], base + ["flips"]),
        "report kdepth": (CLI + ["report", "kdepth", "--results", root, "--format", "json"], base + ["kdepth"]),
        "report all": (CLI + ["report", "all", "--results", root, "--format", "json", "-o", "/dev/null"],
                       base + ["agreement,flips,kdepth"]),
        "query group-by": (CLI + ["query", "--results", root, "--format", "csv", GROUP_BY], base + ["query", GROUP_BY]),
    }
    wanted = [c.strip() for c in args.cases.split(",")]
    out = []
    for name, (cand, bl) in cases.items():
        if name.removeprefix("report ").split()[0] in wanted:
            case = measure(name, cand, bl, repeat, rows)
            out.append(case)
            gib = 2.0 ** 30
            print(f"{name}: {min(case.seconds):.2f} s vs {min(case.baseline_seconds):.2f} s; peak RSS "
                  f"{case.extra['peak_rss_bytes'] / gib:.2f} GiB vs {case.extra['baseline_peak_rss_bytes'] / gib:.2f} GiB",
                  flush=True)
    for c in out:
        c.extra["machine"] = machine()
    emit(out, args.json, title=f"reads at {rows:,} per-position rows (report commands vs hand-written DuckDB)")


if __name__ == "__main__":
    main()
