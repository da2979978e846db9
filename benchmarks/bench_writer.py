"""Stage 2 of issue #14: the result writer against a raw ``pyarrow.parquet.write_table``.

Two cases, each timed interleaved with its baseline (``common.interleaved``) on the same file system
(``--dir``, default under /tmp):

* ``arrow table in``: :meth:`storage.store.ResultStore.write` of a ``teacher_forced`` Arrow table
  (schema cast, Parquet with page checksums into memory, SHA-256 of the bytes, temporary file, fsync,
  rename) against ``pq.write_table`` of the same table to a file (pyarrow's defaults: no fsync, no
  hash). Throughput ratio = baseline seconds / candidate seconds; goal >= 0.8x.
* ``per-position rows``: the whole path a ``teacher_forced`` unit takes now, from the scores its
  engine returns (lists per sequence, as ``tasks.models.ScoreResult`` holds them) to the committed
  file: the kind's real row builder (``tasks.kinds.teacher_forced.position_table`` over the aligned
  scores, as ``run`` calls it), the worker's ``unit_table`` (adds ``unit_id``/``experiment``
  as Arrow columns and casts to the declared schema) and ``ResultStore.write``; against the same raw
  write of the finished table.
* ``arrow table in, fsync skipped`` (diagnostic, informative): the first case with ``os.fsync`` made a
  no-op for the candidate only; the difference is what the fsync of docs/reliability.md costs.
* ``per-position rows from score arrays`` (informative): the same path with the scores held as numpy
  arrays per sequence instead of Python lists: what is left of the gap once the engine's scores
  need no conversion from Python objects.

    .venv/bin/python benchmarks/bench_writer.py [--rows 3000000] [--quick] [--json out.json]
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

from common import Case, emit, interleaved, machine, parser  # noqa: E402


def _scores(n_rows: int, seed: int = 0) -> dict[str, Any]:
    """Synthetic engine output for about ``n_rows`` generated positions (200-400 per prompt), held as
    ``ScoreResult`` holds it: Python lists per sequence (prompt + generated positions)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < n_rows:
        lengths.append(min(int(rng.integers(200, 400)), n_rows - sum(lengths)))
    prompts = rng.integers(8, 32, size=len(lengths)).tolist()
    out: dict[str, Any] = {"generated": [rng.integers(0, 32_000, size=n).tolist() for n in lengths],
                           "firsts": [p - 1 for p in prompts]}
    for side in ("ref", "arm"):
        out[f"{side}_argmax"] = [rng.integers(0, 32_000, size=p + n).tolist() for p, n in zip(prompts, lengths, strict=True)]
        out[f"{side}_margin"] = [rng.lognormal(0, 2, size=p + n).tolist() for p, n in zip(prompts, lengths, strict=True)]
    return out


def main() -> None:
    ap = parser(__doc__ or "")
    ap.add_argument("--rows", type=int, default=None, help="per-position rows (default 3,000,000; --quick 300,000)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--dir", type=Path, default=None, help="where the files go (default: a fresh /tmp/sched_bench-writer-*)")
    args = ap.parse_args()
    rows = args.rows or (300_000 if args.quick else 3_000_000)
    repeat = args.repeat or (3 if args.quick else 5)

    import pyarrow.parquet as pq

    from orchestrator.worker import unit_table
    from storage.store import ResultStore
    from tasks.kinds.teacher_forced import position_table

    where = args.dir or Path(tempfile.mkdtemp(prefix="sched_bench-writer-", dir="/tmp"))
    where.mkdir(parents=True, exist_ok=True)
    try:
        print(f"generating {rows:,} positions ...", flush=True)
        s = _scores(rows)
        gen, firsts = s["generated"], s["firsts"]

        def build() -> Any:
            # As teacher_forced.run calls it on the CPU engine: the scores per sequence, and where
            # each sequence's generated positions start.
            t = position_table("ref", "arm", gen, s["ref_argmax"], s["ref_margin"], s["arm_argmax"], s["arm_margin"], firsts)
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

        import numpy as np

        arrays = {k: [np.asarray(x) for x in s[k]] for k in ("ref_argmax", "ref_margin", "arm_argmax", "arm_margin")}
        gen_arrays = [np.asarray(g) for g in gen]

        def arrays_then_write() -> None:
            t = position_table("ref", "arm", gen_arrays, arrays["ref_argmax"], arrays["ref_margin"], arrays["arm_argmax"],
                               arrays["arm_margin"], firsts)
            store.write("teacher_forced", "bench", "w", unit_table("teacher_forced", t, "0123456789abcdef0123", "bench-tf"))

        mb = table.nbytes / 2**20
        t0 = time.perf_counter()
        build()
        build_s = time.perf_counter() - t0
        cases = []
        times = interleaved({"store": store_write, "raw": raw_write}, repeat=repeat)
        cases.append(Case("writer", f"arrow table in ({table.num_rows:,} rows, {mb:.0f} MiB)", "raw pq.write_table",
                          times["store"], times["raw"], goal=0.8, direction=">=", throughput=True,
                          extra={"rows": table.num_rows}))
        times = interleaved({"rows": rows_then_write, "raw": raw_write}, repeat=repeat)
        cases.append(Case("writer", f"per-position rows, teacher_forced ({table.num_rows:,} rows)", "raw pq.write_table",
                          times["rows"], times["raw"], goal=0.8, direction=">=", throughput=True,
                          notes=f"row building alone {build_s:.2f} s", extra={"rows": table.num_rows, "build_s": build_s}))
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
        times = interleaved({"arrays": arrays_then_write, "raw": raw_write}, repeat=repeat)
        cases.append(Case("writer", f"per-position rows from score arrays ({table.num_rows:,} rows)", "raw pq.write_table",
                          times["arrays"], times["raw"], goal=None, direction=">=", throughput=True,
                          notes="informative: the same row builder if ScoreResult held arrays instead of lists"))
        print(f"machine: {machine()['cpu']}, {machine()['cores']} cores")
        emit(cases, args.json, title=f"writer throughput vs raw pq.write_table, files under {where}")
        for c in cases:
            print(f"  {c.case}: candidate {min(c.seconds):.2f} s, raw {min(c.baseline_seconds):.2f} s (best of {len(c.seconds)})")
    finally:
        if args.dir is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
