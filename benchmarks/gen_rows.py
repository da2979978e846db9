"""Synthetic per-position rows for the read benchmarks, laid out exactly as a sweep writes them.

One sweep (``bench``) of a ``generate`` experiment: ``ARMS`` arms x ``RESTARTS`` cold restarts (one
unit each, writing ``generations``, ``sequences`` and ``arm_runs``), and teacher-forced units
(``TF_REFERENCES`` reference arms, each scored by every other arm: one unit per pair, writing
``teacher_forced``). Every file goes through the real :meth:`storage.store.ResultStore.write`
(``table=<t>/sweep=bench/<unit_id>.parquet``, zstd, page checksums, SHA-256 record), every unit gets
its ledger row from the real ``orchestrator.worker.ledger_row`` (status ``ok`` with its ``files``
records) and the sweep its spec record, so :class:`storage.catalog.Catalog` binds them as verified.

Shapes: sequences of 200-400 generated positions; arms diverge from the reference on a share of the
prompts (then their tokens differ from the divergence on), one arm is not reproducible across
restarts on a few prompts; margins are log-normal over several decades (a few exact ties at 0);
flips are rare (about 1e-4 to 1e-2 per pair, one pair never flips) and concentrated at small
margins (logistic in log10 margin). ``topk_ids`` / ``topk_logits`` are NULL (no report reads them).

``--rows N`` is the number of per-position rows of ``generations`` and, separately, of
``teacher_forced`` (each about N); a ``kdepth`` experiment adds one small unit (one file, 10 rows)
per ``KDEPTH_ROWS_PER_UNIT`` rows, so the file count grows with N as in a real store. The tree is cached: ``<dir>/rows-<N>/`` is reused when its
``rows-<N>.json`` marker (written last) exists, and rebuilt otherwise.

    .venv/bin/python benchmarks/gen_rows.py --rows 10000000 --dir /tmp/swapcheck-bench-rows
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from orchestrator.worker import ledger_row  # noqa: E402
from storage.store import FileRecord, ResultStore, ensure_cache_key, utcnow  # noqa: E402

__all__ = ["ARMS", "DEFAULT_DIR", "SWEEP", "ensure_rows", "generate"]

#: Bump when the generated rows change (a cached tree of another version is rebuilt).
VERSION = "3"
#: Where generated trees are cached (``$SWAPCHECK_BENCH_ROWS_DIR`` overrides it: the smoke test's own tmp).
DEFAULT_DIR = Path(os.environ.get("SWAPCHECK_BENCH_ROWS_DIR") or "/tmp/swapcheck-bench-rows")
SWEEP = "bench"
EXPERIMENT = "bench-generate"
ARMS = ("ref", "cutlass", "triton", "cublas", "torch_fp8", "pow2_cutlass", "pow2_triton", "marlin")
RESTARTS = 2
TF_REFERENCES = ("ref", "cutlass")
MEAN_LENGTH = 300
VOCAB = 32_000
#: One K-depth unit (10 rows, one file) per this many per-position rows.
KDEPTH_ROWS_PER_UNIT = 20_000
#: Share of prompts whose restart-0 sequence diverges from the reference's, per arm.
DIVERGE = {"ref": 0.0, "cutlass": 0.05, "triton": 0.12, "cublas": 0.02, "torch_fp8": 0.35,
           "pow2_cutlass": 0.08, "pow2_triton": 0.15, "marlin": 0.25}
#: The arm whose restarts disagree on a few prompts (not reproducible).
UNSTABLE = "torch_fp8"
#: Log-odds offset of each scored arm's flip probability (-inf: never flips).
FLIP_OFFSET = {"ref": -1.0, "cutlass": -1.5, "triton": -0.5, "cublas": -float("inf"), "torch_fp8": 1.0,
               "pow2_cutlass": -2.0, "pow2_triton": -1.0, "marlin": 0.0}


def _uid(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def _layout(n_prompts: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per prompt lengths and offsets; per row prompt index and position."""
    lengths = rng.integers(MEAN_LENGTH - 100, MEAN_LENGTH + 100, size=n_prompts, dtype=np.int64)
    offsets = np.zeros(n_prompts + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    prompt = np.repeat(np.arange(n_prompts, dtype=np.int32), lengths)
    position = (np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)).astype(np.int32)
    return lengths, offsets, prompt, position


def _margins(n: int, rng: np.random.Generator) -> np.ndarray:
    m = 10.0 ** rng.normal(-0.3, 1.3, size=n)
    m[rng.random(n) < 2e-4] = 0.0  # exact ties
    return m


def _divergence(n_prompts: int, lengths: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """Per prompt, the first position where an arm leaves the reference's tokens (its length: never)."""
    at = rng.integers(0, lengths)
    return np.where(rng.random(n_prompts) < share, at, lengths)


def _write(store: ResultStore, table: str, unit: str, data: dict[str, Any]) -> FileRecord:
    return store.write(table, SWEEP, unit, pa.table(data))


def _commit(store: ResultStore, unit: str, kind: str, params: dict[str, Any], records: list[FileRecord]) -> None:
    payload = {"id": unit, "kind": kind, "experiment": EXPERIMENT, "description": f"{kind} {params}",
               "params": params}
    row = ledger_row(payload, "bench-spec", status="ok", attempts=1, started=utcnow(), duration_s=0.0, error=None,
                     tables=[r.table for r in records], rows=sum(r.rows for r in records), ran_here=False,
                     files=records)
    store.record_unit(SWEEP, row)


def _generate_units(store: ResultStore, rows: int, rng: np.random.Generator) -> list[str]:
    n_prompts = max(1, round(rows / (len(ARMS) * RESTARTS * MEAN_LENGTH)))
    lengths, offsets, prompt, position = _layout(n_prompts, rng)
    n = int(offsets[-1])
    base = rng.integers(0, VOCAB, size=n, dtype=np.int64)
    prompt_hash = [hashlib.sha256(f"prompt-{i}".encode()).hexdigest()[:16] for i in range(n_prompts)]
    units = []
    for a, arm in enumerate(ARMS):
        div = _divergence(n_prompts, lengths, DIVERGE[arm], rng)
        tokens0 = np.where(position >= div[prompt], (base + 1 + a) % VOCAB, base)
        for restart in range(RESTARTS):
            tokens = tokens0
            if restart and arm == UNSTABLE:
                again = _divergence(n_prompts, lengths, 0.03, rng)
                tokens = np.where(position >= again[prompt], (tokens0 + 7) % VOCAB, tokens0)
            unit = _uid("generate", arm, restart, rows)
            seq_hash = [hashlib.sha256(tokens[offsets[i]:offsets[i + 1]].tobytes()).hexdigest()[:16]
                        for i in range(n_prompts)]
            ident = {"unit_id": [unit], "experiment": [EXPERIMENT]}

            def const(value: Any, count: int, typ: pa.DataType) -> pa.Array:
                return pa.repeat(pa.scalar(value, typ), count)

            gen = {"unit_id": const(unit, n, pa.string()), "experiment": const(EXPERIMENT, n, pa.string()),
                   "arm": const(arm, n, pa.string()), "restart": const(restart, n, pa.int32()),
                   "prompt_index": prompt, "position": position, "token": tokens, "margin": _margins(n, rng),
                   "topk_ids": pa.nulls(n, pa.list_(pa.int64())), "topk_logits": pa.nulls(n, pa.list_(pa.float64()))}
            seqs = {"unit_id": const(unit, n_prompts, pa.string()), "experiment": const(EXPERIMENT, n_prompts, pa.string()),
                    "arm": const(arm, n_prompts, pa.string()), "restart": const(restart, n_prompts, pa.int32()),
                    "prompt_index": np.arange(n_prompts, dtype=np.int32), "prompt_hash": prompt_hash,
                    "sequence_hash": seq_hash, "n_tokens": lengths.astype(np.int32),
                    "tokens": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(tokens))}
            runs = {**ident, "arm": [arm], "restart": pa.array([restart], pa.int32()), "model": ["synthetic"],
                    "engine": ["hf"], "configured_kernel": [arm], "scales": ["pow2" if arm.startswith("pow2") else "real"],
                    "env_json": ["{}"], "host": ["bench-host"], "pid": [10_000 + 10 * a + restart],
                    "observed_kernels": [[arm]], "kernel_calls_json": ["{}"], "evidence_ok": [True],
                    "weights_sha256": ["0" * 64]}
            records = [_write(store, "generations", unit, gen), _write(store, "sequences", unit, seqs),
                       _write(store, "arm_runs", unit, runs)]
            _commit(store, unit, "generate", {"arm": arm, "restart": restart, "rows": rows}, records)
            units.append(unit)
    return units


def _teacher_forced_units(store: ResultStore, rows: int, rng: np.random.Generator) -> list[str]:
    pairs = [(r, a) for r in TF_REFERENCES for a in ARMS if a != r]
    n_prompts = max(1, round(rows / (len(pairs) * MEAN_LENGTH)))
    lengths, offsets, prompt, position = _layout(n_prompts, rng)
    n = int(offsets[-1])
    ref_token = rng.integers(0, VOCAB, size=n, dtype=np.int64)
    units = []
    for ref, arm in pairs:
        unit = _uid("teacher_forced", ref, arm, rows)
        margin = _margins(n, rng)
        # P(flip | m): logistic in log10(m + 1e-7), steep: flips sit at small margins.
        z = FLIP_OFFSET[arm] - 6.0 - 1.6 * np.log10(margin + 1e-7)
        flip = rng.random(n) < 1.0 / (1.0 + np.exp(-z))
        ref_argmax = ref_token.copy()
        ref_argmax[rng.random(n) < 1e-6] += 1  # teacher forcing almost always reproduces decoding
        arm_argmax = np.where(flip, (ref_argmax + 1) % VOCAB, ref_argmax)
        data = {"unit_id": pa.repeat(pa.scalar(unit), n), "experiment": pa.repeat(pa.scalar(EXPERIMENT), n),
                "ref_arm": pa.repeat(pa.scalar(ref), n), "ref_restart": pa.repeat(pa.scalar(0, pa.int32()), n),
                "arm": pa.repeat(pa.scalar(arm), n), "prompt_index": prompt, "position": position,
                "ref_token": ref_token, "ref_argmax": ref_argmax, "ref_margin": margin, "arm_argmax": arm_argmax,
                "arm_margin": np.abs(margin + rng.normal(0.0, 1e-3, size=n)), "flip": flip}
        # the per-token probabilities (issue #27): p_ref mostly near 1, the arm's within ~1e-3 of it
        p_ref = np.clip(rng.beta(4.0, 0.6, size=n), 1e-6, 1.0)
        p_arm = np.clip(p_ref * np.exp(rng.normal(0.0, 1e-3, size=n)), 1e-6, 1.0)
        r = p_arm / p_ref
        data |= {"ref_token_prob_ref": p_ref, "ref_token_prob_arm": p_arm,
                 "kl_ref_arm": np.abs(rng.normal(0.0, 1e-6, size=n)), "k3_ref_arm": r - 1.0 - np.log(r)}
        _commit(store, unit, "teacher_forced", {"reference": ref, "arm": arm, "rows": rows},
                [_write(store, "teacher_forced", unit, data)])
        units.append(unit)
    return units


def _kdepth_units(store: ResultStore, rows: int, rng: np.random.Generator) -> list[str]:
    """``rows // KDEPTH_ROWS_PER_UNIT`` K-depth units (one file each: the catalog's cost per file)."""
    impls = ("cutlass", "triton", "cublas", "marlin")
    pairs = [("pair", a, b) for i, a in enumerate(impls) for b in impls[i + 1:]] + [("reference", a, "ref") for a in impls]
    ks = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    units = []
    for u in range(max(1, rows // KDEPTH_ROWS_PER_UNIT)):
        dtype, scale_mode, k, seed = ("int8", "fp8_e4m3")[u % 2], ("real", "pow2")[(u // 2) % 2], ks[(u // 4) % 8], u // 32
        unit = _uid("kdepth", u, rows)
        n = len(pairs)
        elements = np.full(n, 256 * 256, dtype=np.int64)
        differing = rng.binomial(elements, 1e-4 * np.log2(k))
        hist = np.stack([rng.binomial(differing, 0.8), rng.binomial(differing, 0.15)])
        data = {"unit_id": [unit] * n, "experiment": ["bench-kdepth"] * n, "dtype": [dtype] * n,
                "out_dtype": ["bfloat16"] * n, "m": [256] * n, "n": [256] * n, "k": [k] * n, "seed": [seed] * n,
                "scale_mode": [scale_mode] * n, "bias": [False] * n, "comparison": [c for c, _, _ in pairs],
                "impl_a": [a for _, a, _ in pairs], "impl_b": [b for _, _, b in pairs], "kernel_a": [a for _, a, _ in pairs],
                "kernel_b": [b for _, _, b in pairs], "elements": elements, "differing": differing,
                "frac_differing": differing / elements, "max_spacing": np.where(differing > 0, rng.integers(1, 4, n), 0),
                "max_spacing_significant": np.where(differing > 0, rng.integers(0, 3, n), 0),
                "hist_0": elements - differing, "hist_1": hist[0], "hist_2": hist[1],
                "hist_gt2": np.maximum(differing - hist[0] - hist[1], 0), "nonfinite_mismatch": np.zeros(n, np.int64),
                "max_abs_error": rng.random(n) * 1e-2, "worst_row": np.zeros(n, np.int32), "worst_col": np.zeros(n, np.int32),
                "worst_a": rng.random(n), "worst_b": rng.random(n), "seconds_a": rng.random(n), "seconds_b": rng.random(n)}
        _commit(store, unit, "kdepth", {"unit": u, "rows": rows}, [store.write("kdepth", SWEEP, unit, data_table("kdepth", data))])
        units.append(unit)
    return units


def data_table(table: str, data: dict[str, Any]) -> pa.Table:
    """``data`` as the table's declared schema; a declared column it lacks (one added since this
    generator was written) is all nulls, as the writer's own files would hold where it has no value."""
    from storage.schemas import TABLES

    schema = TABLES[table]
    n = len(next(iter(data.values())))
    return pa.table({f.name: data[f.name] if f.name in data else pa.nulls(n, f.type) for f in schema}).cast(schema)


def schemas_key() -> str:
    """The declared schemas' fingerprint (storage.schemas.fingerprint): a cached tree written under
    others is generated anew, so that the reads measure files as the current writer writes them."""
    from storage.schemas import fingerprint

    return fingerprint()[:16]


def generate(root: Path, rows: int, seed: int = 0) -> dict[str, Any]:
    """Write the whole tree under ``root`` (replaced); return what was written."""
    if root.exists():
        shutil.rmtree(root)
    store = ResultStore(root)
    rng = np.random.default_rng(seed)
    units = _generate_units(store, rows, rng) + _teacher_forced_units(store, rows, rng) + _kdepth_units(store, rows, rng)
    store.write("sweeps", SWEEP, "spec", [{
        "spec_sha256": "bench-spec", "question": "synthetic rows for the read benchmarks",
        "spec_path": "benchmarks/gen_rows.py", "spec_toml": "", "n_units": len(units), "unit_ids": units,
        "created_at": utcnow()}])
    ensure_cache_key(store)  # as a launch does: readers' verified-files caches are signed with it
    return {"rows": rows, "version": VERSION, "seed": seed, "schemas": schemas_key(), "units": len(units), "sweep": SWEEP}


def ensure_rows(directory: Path, rows: int, seed: int = 0) -> Path:
    """The results root holding ``rows`` per-position rows (cached under ``directory``)."""
    root = directory / f"rows-{rows}"
    marker = directory / f"rows-{rows}.json"
    want = {"rows": rows, "version": VERSION, "seed": seed, "schemas": schemas_key()}
    if marker.exists() and root.exists():
        have = json.loads(marker.read_text())
        if all(have.get(k) == v for k, v in want.items()):
            ensure_cache_key(ResultStore(root))  # a tree cached before trees had one
            return root
    marker.unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = generate(root, rows, seed)
    info["seconds"] = round(time.perf_counter() - t0, 1)
    marker.write_text(json.dumps(info))
    print(f"generated {rows:,} rows per table under {root} in {info['seconds']} s", file=sys.stderr)
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="per-position rows of each table")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="cache directory")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(ensure_rows(args.dir, args.rows, args.seed))


if __name__ == "__main__":
    main()
