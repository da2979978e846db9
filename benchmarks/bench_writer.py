"""Stage 2 of issue #14: the result writer against a raw ``pyarrow.parquet.write_table``, each side
doing the same work from the same input (issue #25).

Each case times the candidate and its baseline alternately (``common.interleaved``), on the same file
system (``--dir``, default under /tmp); the ratio is a throughput ratio (baseline seconds / candidate
seconds, goal >= 0.8x), judged on the median of the pairs:

* ``arrow table in``: both sides get the same ``teacher_forced`` Arrow table (unit_id and experiment
  columns included). Candidate: :meth:`storage.store.ResultStore.write` (schema cast, Parquet with
  page checksums into memory, SHA-256 of the bytes, temporary file, fsync, rename). Baseline:
  ``pq.write_table`` of the table to a file (pyarrow's defaults: no fsync, no hash).
* ``per-position rows``: both sides get a ``teacher_forced`` unit's engine output, the two
  ``tasks.models.ScoreResult`` (one numpy array per sequence and field, prompt + generated
  positions), the first scored position and the generated length of each sequence. Candidate: the
  kind's row builder (``tasks.kinds.teacher_forced.scores_table``, exactly as ``run`` calls it), the
  worker's ``unit_table`` (unit_id/experiment columns, declared schema) and ``ResultStore.write``.
  Baseline (``hand_table``): the same table built by hand with numpy (each field's generated
  positions sliced per sequence and concatenated, prompt index and position by ``np.repeat``, flip
  as the two argmax compared) and ``pa.table`` with the declared types, then ``pq.write_table``.
  The two tables are checked equal before timing.
* ``dict rows in``: both sides get a kind's rows as a list of dicts (a tenth of ``--rows``; the
  form ``run`` returns for most kinds). Candidate: ``unit_table`` (``storage.store.to_table``:
  ``pa.Table.from_pylist`` against the declared schema, constant columns) and ``ResultStore.write``.
  Baseline: ``pa.Table.from_pylist`` with the declared schema, the constant columns added, then
  ``pq.write_table``.
* ``arrow table in, fsync skipped`` (diagnostic, informative): the first case with ``os.fsync`` made a
  no-op for the candidate only; the difference is what the fsync of docs/reliability.md costs.

Both sides run with the same thread count (``--threads``, default 1: Arrow's CPU pool and OpenMP;
``common.apply_threads``). ``--smoke``: 20,000 rows, one pair per case (a check of the harness).

    .venv/bin/python benchmarks/bench_writer.py [--rows 3000000] [--quick | --smoke] [--threads N] [--json out.json]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import Case, apply_threads, emit, interleaved, machine, parser, pick  # noqa: E402


def _scores(n_rows: int, seed: int = 0) -> tuple[Any, Any, list[int], list[int]]:
    """Synthetic engine output for about ``n_rows`` generated positions (200-400 per prompt, prompts of
    8-32 tokens): the reference arm's and the other arm's ``ScoreResult`` over the same sequences (as
    the engine builds them: one array per sequence and field), the position predicting each
    sequence's first generated token, and the generated lengths."""
    import numpy as np

    from tasks.models.predictions import ScoreResult

    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < n_rows:
        lengths.append(min(int(rng.integers(200, 400)), n_rows - sum(lengths)))
    prompts = rng.integers(8, 32, size=len(lengths)).tolist()
    tokens = [rng.integers(0, 32_000, size=p + n) for p, n in zip(prompts, lengths, strict=True)]
    out = []
    for _side in ("ref", "arm"):
        res = ScoreResult([t.tolist() for t in tokens] if not out else out[0].sequences)
        for t in tokens:
            ids = rng.integers(0, 32_000, size=(len(t), 2))
            logits = np.sort(rng.normal(0, 4, size=(len(t), 2)).astype(np.float32), axis=1)[:, ::-1]
            target_logits = rng.normal(0, 4, size=len(t)).astype(np.float32).astype(np.float64)
            target_logits[-1] = np.nan
            res.append(ids[:, 0], ids, logits, logits[:, 0].astype(np.float64) - logits[:, 1].astype(np.float64),
                       np.append(t[1:], -1), target_logits)
        out.append(res)
    return out[0], out[1], [p - 1 for p in prompts], lengths


UNIT, EXPERIMENT = "0123456789abcdef0123", "bench-tf"


def hand_table(ref: Any, other: Any, firsts: list[int], lengths: list[int]) -> Any:
    """The ``teacher_forced`` table of one unit built by hand from the engine's scores (the baseline's
    build): the generated positions of each sequence sliced and concatenated per field."""
    import numpy as np
    import pyarrow as pa

    counts = np.asarray(lengths, dtype=np.int64)
    n = int(counts.sum())

    def cat(per_seq: list[Any], dtype: Any) -> Any:
        return np.concatenate([a[f: f + k] for a, f, k in zip(per_seq, firsts, lengths, strict=True)]).astype(dtype)

    starts = np.repeat(np.cumsum(counts) - counts, counts)
    ra, aa = cat(ref.argmax, np.int64), cat(other.argmax, np.int64)
    return pa.table({
        "unit_id": pa.repeat(pa.scalar(UNIT, pa.string()), n),
        "experiment": pa.repeat(pa.scalar(EXPERIMENT, pa.string()), n),
        "ref_arm": pa.repeat(pa.scalar("ref", pa.string()), n),
        "ref_restart": np.zeros(n, dtype=np.int32),
        "arm": pa.repeat(pa.scalar("arm", pa.string()), n),
        "prompt_index": np.repeat(np.arange(len(lengths), dtype=np.int32), counts),
        "position": (np.arange(n, dtype=np.int64) - starts).astype(np.int32),
        "ref_token": cat(ref.targets, np.int64),
        "ref_argmax": ra,
        "ref_margin": cat(ref.margins, np.float64),
        "arm_argmax": aa,
        "arm_margin": cat(other.margins, np.float64),
        "flip": ra != aa,
        # the per-token probability columns: NULL where the scores carry no full logits (as here)
        **{c: pa.nulls(n, pa.float64()) for c in ("ref_token_prob_ref", "ref_token_prob_arm", "kl_ref_arm",
                                                   "k3_ref_arm")},
    })


def main() -> None:
    ap = parser(__doc__ or "")
    ap.add_argument("--rows", type=int, default=None,
                    help="per-position rows (default 3,000,000; --quick 300,000; --smoke 20,000); "
                         "the dict-rows case takes a tenth")
    ap.add_argument("--repeat", type=int, default=None, help="pairs per case (default 5; --quick 3; --smoke 1)")
    ap.add_argument("--dir", type=Path, default=None, help="where the files go (default: a fresh /tmp/sched_bench-writer-*)")
    args = ap.parse_args()
    rows = args.rows or pick(args, 3_000_000, 300_000, 20_000)
    repeat = args.repeat or pick(args, 5, 3, 1)

    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.worker import unit_table
    from storage.schemas import TABLES
    from storage.store import ResultStore
    from tasks.kinds.teacher_forced import scores_table

    threads = apply_threads(args.threads)
    print(f"threads {threads}", flush=True)

    where = args.dir or Path(tempfile.mkdtemp(prefix="sched_bench-writer-", dir="/tmp"))
    where.mkdir(parents=True, exist_ok=True)
    try:
        print(f"generating {rows:,} positions ...", flush=True)
        ref_scores, arm_scores, firsts, lengths = _scores(rows)

        def build() -> Any:
            # As teacher_forced.run calls it on the CPU engine: both arms' scores, where each
            # sequence's generated positions start and how many there are.
            t = scores_table("ref", "arm", ref_scores, arm_scores, firsts, lengths)
            return unit_table("teacher_forced", t, UNIT, EXPERIMENT)

        table = build()
        by_hand = hand_table(ref_scores, arm_scores, firsts, lengths)
        if not by_hand.equals(table):  # the baseline must build what the candidate builds
            raise AssertionError(f"the hand-built table differs from the kind's:\n{by_hand.schema}\n{table.schema}")
        schema = TABLES["teacher_forced"]
        n_dicts = max(1, rows // 10)
        dict_rows = table.slice(0, n_dicts).drop_columns(["unit_id", "experiment"]).to_pylist()
        dict_schema = pa.schema([f for f in schema if f.name not in ("unit_id", "experiment")])
        store = ResultStore(where / "store")
        raw = where / "raw"
        raw.mkdir(exist_ok=True)
        n = [0]

        def raw_path() -> Path:
            n[0] += 1
            return raw / f"{n[0]}.parquet"

        def raw_write() -> None:
            pq.write_table(table, raw_path())

        def store_write() -> None:
            store.write("teacher_forced", "bench", "u", table)

        def rows_then_write() -> None:
            store.write("teacher_forced", "bench", "v", build())

        def hand_then_write() -> None:
            pq.write_table(hand_table(ref_scores, arm_scores, firsts, lengths), raw_path())

        def dicts_then_write() -> None:
            store.write("teacher_forced", "bench", "d", unit_table("teacher_forced", dict_rows, UNIT, EXPERIMENT))

        def dicts_by_hand() -> None:
            t = pa.Table.from_pylist(dict_rows, schema=dict_schema)
            t = t.add_column(0, "experiment", pa.repeat(pa.scalar(EXPERIMENT, pa.string()), t.num_rows))
            t = t.add_column(0, "unit_id", pa.repeat(pa.scalar(UNIT, pa.string()), t.num_rows))
            pq.write_table(t, raw_path())

        mb = table.nbytes / 2**20
        build_times = []
        for _ in range(3):  # the best of three: the first builds of a process also pay for fresh memory
            t0 = time.perf_counter()
            build()
            build_times.append(time.perf_counter() - t0)
        build_s = min(build_times)
        cases = []
        same = "same input, same table"
        times = interleaved({"store": store_write, "raw": raw_write}, repeat=repeat)
        cases.append(Case("writer", f"arrow table in ({table.num_rows:,} rows, {mb:.0f} MiB)", "raw pq.write_table",
                          times["store"], times["raw"], goal=0.8, direction=">=", throughput=True,
                          notes=same, extra={"rows": table.num_rows}))
        times = interleaved({"rows": rows_then_write, "raw": hand_then_write}, repeat=repeat)
        cases.append(Case("writer", f"per-position rows, teacher_forced ({table.num_rows:,} rows)",
                          "table built by hand from the same scores + raw pq.write_table",
                          times["rows"], times["raw"], goal=0.8, direction=">=", throughput=True,
                          notes=f"{same}; the kind's row building alone {build_s:.2f} s (best of 3)",
                          extra={"rows": table.num_rows, "build_s": build_s}))
        times = interleaved({"rows": dicts_then_write, "raw": dicts_by_hand}, repeat=repeat)
        cases.append(Case("writer", f"dict rows in, teacher_forced ({n_dicts:,} rows)",
                          "pa.Table.from_pylist (declared schema) + raw pq.write_table",
                          times["rows"], times["raw"], goal=0.8, direction=">=", throughput=True, notes=same,
                          extra={"rows": n_dicts}))
        import os

        real_fsync = os.fsync

        def store_write_no_fsync() -> None:
            os.fsync = lambda fd: None  # diagnostic only: what the durability guarantee costs
            try:
                store.write("teacher_forced", "bench", "x", table)
            finally:
                os.fsync = real_fsync

        times = interleaved({"store": store_write_no_fsync, "raw": raw_write}, repeat=repeat)
        cases.append(Case("writer", "arrow table in, fsync skipped (diagnostic)", "raw pq.write_table",
                          times["store"], times["raw"], goal=None, direction=">=", throughput=True,
                          notes="informative: the same write without the fsync the store promises"))
        for c in cases:
            c.extra["pair_ratios"] = c.pair_ratios()
        m = machine()
        print(f"machine: {m['cpu']}, {m['cores']} cores")
        emit(cases, args.json, title=f"writer throughput vs raw pq.write_table, files under {where}")
        for c in cases:
            print(f"  {c.case}: candidate median {statistics.median(c.seconds):.2f} s, baseline median "
                  f"{statistics.median(c.baseline_seconds):.2f} s ({len(c.seconds)} pairs)")
    finally:
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
