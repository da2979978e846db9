"""Stage 2 of issue #14: the result writer against a raw ``pyarrow.parquet.write_table``.

Two cases, each timed interleaved with its baseline (``common.interleaved``) on the same file system
(``--dir``, default under /tmp):

* ``arrow table in``: :meth:`storage.store.ResultStore.write` of a ``teacher_forced`` Arrow table
  (schema cast, Parquet with page checksums into memory, SHA-256 of the bytes, temporary file, fsync,
  rename) against ``pq.write_table`` of the same table to a file (pyarrow's defaults: no fsync, no
  hash). Throughput ratio = baseline seconds / candidate seconds; goal >= 0.8x.
* ``per-position rows``: the whole path a ``teacher_forced`` unit takes, from the two
  ``tasks.models.ScoreResult`` its engines return (one numpy array per sequence and field, prompt +
  generated positions) to the committed file: the kind's row builder
  (``tasks.kinds.teacher_forced.scores_table``, exactly as ``run`` calls it), the worker's
  ``unit_table`` (adds ``unit_id``/``experiment`` as Arrow columns, declared schema) and
  ``ResultStore.write``; against the same raw write of the finished table.
* ``arrow table in, fsync skipped`` (diagnostic, informative): the first case with ``os.fsync`` made a
  no-op for the candidate only; the difference is what the fsync of docs/reliability.md costs.

Both sides run with the same thread count (``--threads``, default 1: Arrow's CPU pool and OpenMP;
``common.apply_threads``). ``--smoke``: 20,000 rows, one pair per case (a check of the harness).

    .venv/bin/python benchmarks/bench_writer.py [--rows 3000000] [--quick | --smoke] [--threads N] [--json out.json]
"""

from __future__ import annotations

import shutil
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


def main() -> None:
    ap = parser(__doc__ or "")
    ap.add_argument("--rows", type=int, default=None,
                    help="per-position rows (default 3,000,000; --quick 300,000; --smoke 20,000)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--dir", type=Path, default=None, help="where the files go (default: a fresh /tmp/sched_bench-writer-*)")
    args = ap.parse_args()
    rows = args.rows or pick(args, 3_000_000, 300_000, 20_000)
    repeat = args.repeat or pick(args, 5, 3, 1)

    import pyarrow.parquet as pq

    from orchestrator.worker import unit_table
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
            return unit_table("teacher_forced", t, "0123456789abcdef0123", "bench-tf")

        table = build()
        store = ResultStore(where / "store")
        raw = where / "raw"
        raw.mkdir(exist_ok=True)
        n = [0]

        def raw_write() -> None:
            n[0] += 1
            pq.write_table(table, raw / f"{n[0]}.parquet")

        def store_write() -> None:
            store.write("teacher_forced", "bench", "u", table)

        def rows_then_write() -> None:
            store.write("teacher_forced", "bench", "v", build())

        mb = table.nbytes / 2**20
        build_times = []
        for _ in range(3):  # the best of three: the first builds of a process also pay for fresh memory
            t0 = time.perf_counter()
            build()
            build_times.append(time.perf_counter() - t0)
        build_s = min(build_times)
        cases = []
        times = interleaved({"store": store_write, "raw": raw_write}, repeat=repeat)
        cases.append(Case("writer", f"arrow table in ({table.num_rows:,} rows, {mb:.0f} MiB)", "raw pq.write_table",
                          times["store"], times["raw"], goal=0.8, direction=">=", throughput=True,
                          extra={"rows": table.num_rows}))
        times = interleaved({"rows": rows_then_write, "raw": raw_write}, repeat=repeat)
        cases.append(Case("writer", f"per-position rows, teacher_forced ({table.num_rows:,} rows)", "raw pq.write_table",
                          times["rows"], times["raw"], goal=0.8, direction=">=", throughput=True,
                          notes=f"row building alone {build_s:.2f} s (best of 3)", extra={"rows": table.num_rows, "build_s": build_s}))
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
        m = machine()
        print(f"machine: {m['cpu']}, {m['cores']} cores")
        emit(cases, args.json, title=f"writer throughput vs raw pq.write_table, files under {where}")
        for c in cases:
            print(f"  {c.case}: candidate {min(c.seconds):.2f} s, raw {min(c.baseline_seconds):.2f} s (best of {len(c.seconds)})")
    finally:
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
