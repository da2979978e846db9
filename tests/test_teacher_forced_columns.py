"""The ``teacher_forced`` rows built column by column from the engines' score arrays are the rows a
plain per-position loop builds from the same scores: same schema, same column order, every value bit
for bit (floats compared by their bits, NaN and infinities included).

The reference here is deliberately the obvious code: Python values (``.tolist()``), one dict per
generated position, ``pa.Table.from_pylist`` with the declared types -- what the kind did before its
scores were arrays.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from orchestrator.worker import unit_table
from storage.schemas import TABLES
from tasks.kinds import generate, teacher_forced
from tasks.models.arms import build_arm_model
from tasks.models.predictions import ScoreResult, predict, predict_arrays, target_values
from tasks.prompts import prompts_from_payload

pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed

COLUMNS = ["ref_arm", "ref_restart", "arm", "prompt_index", "position", "ref_token", "ref_argmax", "ref_margin",
           "arm_argmax", "arm_margin", "flip"]
TYPES = {"ref_arm": pa.string(), "ref_restart": pa.int32(), "arm": pa.string(), "prompt_index": pa.int32(),
         "position": pa.int32(), "ref_token": pa.int64(), "ref_argmax": pa.int64(), "ref_margin": pa.float64(),
         "arm_argmax": pa.int64(), "arm_margin": pa.float64(), "flip": pa.bool_()}


def reference_rows(ref_arm: str, arm: str, generated: list[list[int]], ref: Any, other: Any,
                   firsts: list[int]) -> pa.Table:
    """One dict per generated position, from Python values: the straightforward way."""
    rows = []
    for i, gen in enumerate(generated):
        ra, rm = list(ref.argmax[i]), list(ref.margins[i])
        aa, am = list(other.argmax[i]), list(other.margins[i])
        ra, rm, aa, am = ([x.item() if hasattr(x, "item") else x for x in v] for v in (ra, rm, aa, am))
        for p, tok in enumerate(gen):
            pos = firsts[i] + p
            rows.append({"ref_arm": ref_arm, "ref_restart": 0, "arm": arm, "prompt_index": i, "position": p,
                         "ref_token": int(tok), "ref_argmax": ra[pos], "ref_margin": rm[pos], "arm_argmax": aa[pos],
                         "arm_margin": am[pos], "flip": ra[pos] != aa[pos]})
    return pa.Table.from_pylist(rows, schema=pa.schema([(c, TYPES[c]) for c in COLUMNS]))


def assert_bitwise_equal(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.equals(want.schema), (got.schema, want.schema)
    assert got.column_names == want.column_names and got.num_rows == want.num_rows
    for name in got.column_names:
        a, b = got.column(name).combine_chunks(), want.column(name).combine_chunks()
        assert a.null_count == 0 and b.null_count == 0, name
        if pa.types.is_floating(a.type):
            bits_a = a.to_numpy(zero_copy_only=False).view(np.uint64)
            bits_b = b.to_numpy(zero_copy_only=False).view(np.uint64)
            assert np.array_equal(bits_a, bits_b), name
        else:
            assert a.equals(b), name


class FakeContext:
    """What the worker's UnitFiles gives a kind: rows an earlier stage wrote, here held in memory."""

    def __init__(self, tables: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
        self.tables = tables

    def put_artifact(self, name: str, data: bytes) -> str:  # pragma: no cover - not used by the kind
        raise AssertionError("teacher_forced writes no artifacts")

    def read_unit(self, table: str, unit_id: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        rows = self.tables[table][unit_id]
        return [{c: r[c] for c in columns} if columns else dict(r) for r in rows]


@pytest.fixture(scope="module")
def unit() -> dict[str, Any]:
    """A real tiny-model teacher_forced unit: the reference arm's generate unit run here, its rows
    served to the teacher-forced unit as the store would serve them."""
    exp = generate.GenerateExperiment.model_validate({
        "kind": "generate", "restarts": 1, "max_new_tokens": 10, "prompts": {"count": 3, "length": 6, "seed": 2},
        "arms": {"cutlass": {"kernel": "int8-cutlass-order", "scales": "real"},
                 "triton": {"kernel": "int8-triton-order", "scales": "pow2"}},
        "teacher_forced": [{"reference": "cutlass", "arms": ["triton"]}]})
    units = generate.expand("cols", exp)
    gen_unit = next(u for u in units if u.kind == "generate" and u.params["arm"]["name"] == "cutlass")
    tf_unit = next(u for u in units if u.kind == "teacher_forced")
    produced = generate.run(gen_unit.params)
    ctx = FakeContext({"sequences": {gen_unit.id: produced["sequences"]}})
    return {"params": tf_unit.params, "ctx": ctx, "sequences": produced["sequences"]}


def test_run_builds_the_rows_a_per_position_loop_builds(unit: dict[str, Any]) -> None:
    params, ctx = unit["params"], unit["ctx"]
    full = teacher_forced.run(params, ctx)["teacher_forced"]
    assert isinstance(full, pa.Table)
    assert full.column_names == COLUMNS + list(teacher_forced.DISTRIBUTION)  # checked in tests/test_divergence_kind.py
    got = full.select(COLUMNS)

    # The same scores, computed again here (the engine is deterministic), and the rows built by hand.
    ref_model = build_arm_model({**params, "arm": params["reference"]})
    prompts = prompts_from_payload(params["prompts"], int(ref_model.config.vocab_size))
    generated = [list(r["tokens"]) for r in sorted(unit["sequences"], key=lambda r: r["prompt_index"])]
    sequences = [p + g for p, g in zip(prompts, generated, strict=True)]
    ref_scores = ref_model.score(sequences, top_k=2)
    arm_scores = build_arm_model(params).score(sequences, top_k=2)
    firsts = [len(p) - 1 for p in prompts]
    want = reference_rows(params["reference"]["name"], params["arm"]["name"], generated, ref_scores, arm_scores, firsts)
    assert want.num_rows == 3 * 10
    assert_bitwise_equal(got, want)
    # Every value went through the arrays: the reference token is the generated token.
    assert got.column("ref_token").to_pylist() == [t for g in generated for t in g]

    # ... and through the worker, as the declared schema (unit_id and experiment added).
    declared = unit_table("teacher_forced", full, "u" * 20, "cols")
    want_declared = unit_table("teacher_forced", want, "u" * 20, "cols")
    assert declared.schema.equals(TABLES["teacher_forced"])
    kept = ["unit_id", "experiment", *COLUMNS]
    assert_bitwise_equal(declared.select(kept), want_declared.select(kept))


def test_score_arrays_hold_the_values_the_lists_held(unit: dict[str, Any]) -> None:
    """ScoreResult's arrays are predict()'s Python values, bit for bit; target logits are the
    per-position ``float(logits[i, t])`` of before (NaN after the last token)."""
    params = unit["params"]
    model = build_arm_model(params)
    seq = [int(t) for t in unit["sequences"][0]["tokens"]][:12]
    logits = model.forward_tokens([seq])[0]
    am, ids, vals, mg = predict_arrays(logits, 3)
    am_l, ids_l, vals_l, mg_l = predict(logits, 3)
    assert am.dtype == np.int64 and ids.dtype == np.int64 and vals.dtype == np.float64 and mg.dtype == np.float64
    assert am.tolist() == am_l and ids.tolist() == ids_l
    assert [[x.hex() for x in r] for r in vals.tolist()] == [[x.hex() for x in r] for r in vals_l]
    assert [x.hex() for x in mg.tolist()] == [x.hex() for x in mg_l]

    scores = model.score([seq], top_k=3)
    targets = seq[1:] + [-1]
    assert scores.targets[0].tolist() == targets
    old = [float(logits[i, t]) if t >= 0 else float("nan") for i, t in enumerate(targets)]
    new = scores.target_logits[0].tolist()
    assert [x.hex() for x in new[:-1]] == [x.hex() for x in old[:-1]] and math.isnan(new[-1])
    assert scores.target_logits[0].view(np.uint64)[-1] == np.array([math.nan]).view(np.uint64)[0]
    assert scores.rows()[0] == {"sequence": 0, "position": 0, "argmax": am_l[0], "target": seq[1],
                                "target_logit": old[0], "topk_ids": ids_l[0], "topk_logits": vals_l[0],
                                "margin": mg_l[0]}


def test_non_finite_logits_and_margins_survive_bit_for_bit() -> None:
    """-inf / inf / NaN logits (the full-sort fallback) and the margins they give, through
    predict_arrays, target_values and the table."""
    x = torch.tensor([[1.0, float("-inf"), 3.0, 3.0], [float("inf"), 2.0, float("inf"), 0.0],
                      [float("nan"), 1.0, 2.0, -1.0], [float("-inf")] * 4], dtype=torch.float32)
    am, ids, vals, mg = predict_arrays(x, 2)
    am_l, ids_l, vals_l, mg_l = predict(x, 2)
    assert am.tolist() == am_l and ids.tolist() == ids_l
    assert np.array_equal(vals.view(np.uint64), np.array(vals_l, dtype=np.float64).view(np.uint64))
    assert np.array_equal(mg.view(np.uint64), np.array(mg_l, dtype=np.float64).view(np.uint64))
    targets = np.array([2, 1, 3, -1], dtype=np.int64)
    tv = target_values(x, targets)
    assert tv[:3].tolist() == [3.0, 2.0, -1.0] and math.isnan(tv[3])

    res = ScoreResult([[0, 2, 1, 3, 9]])
    res.append(am, ids, vals, mg, targets, tv)
    other = ScoreResult([[0, 2, 1, 3, 9]])
    other.append(am[::-1].copy(), ids, vals, np.array([-math.inf, math.nan, 0.0, -0.0]), targets, tv)
    got = teacher_forced.position_table("a", "b", [np.array([7, 8, 9])], res.argmax, res.margins, other.argmax,
                                        other.margins, [1])
    want = reference_rows("a", "b", [[7, 8, 9]], res, other, [1])
    assert_bitwise_equal(got, want)
    assert np.signbit(got.column("arm_margin").to_numpy()[2])  # -0.0 stays -0.0


def test_lists_arrays_and_mixed_inputs_give_one_table() -> None:
    rng = np.random.default_rng(3)
    lengths, firsts = [5, 0, 7, 1], [2, 0, 4, 3]
    gen = [rng.integers(0, 100, size=n) for n in lengths]
    fields = [[rng.integers(0, 5, size=f + n + 1) if k % 2 == 0 else rng.lognormal(size=f + n + 1) for f, n in
               zip(firsts, lengths, strict=True)] for k in range(4)]
    as_arrays = teacher_forced.position_table("r", "a", gen, *fields, firsts)
    as_lists = teacher_forced.position_table("r", "a", [g.tolist() for g in gen],
                                             *[[x.tolist() for x in f] for f in fields], firsts)
    mixed = teacher_forced.position_table("r", "a", gen, fields[0], [x.tolist() for x in fields[1]],
                                          [torch.from_numpy(x) for x in fields[2]], fields[3], firsts)
    assert as_arrays.num_rows == sum(lengths) and as_arrays.column_names == COLUMNS
    assert_bitwise_equal(as_lists, as_arrays)
    assert_bitwise_equal(mixed, as_arrays)
    flips = (as_arrays.column("ref_argmax").to_numpy() != as_arrays.column("arm_argmax").to_numpy())
    assert flips.any() and (as_arrays.column("flip").to_numpy(zero_copy_only=False) == flips).all()
    empty = teacher_forced.position_table("r", "a", [], [], [], [], [], [])
    assert empty.num_rows == 0 and empty.column_names == COLUMNS


def test_short_predictions_are_refused() -> None:
    gen = [np.arange(4), np.arange(3)]
    preds = [np.zeros(5, dtype=np.int64), np.zeros(3, dtype=np.int64)]  # sequence 0 lacks position 1 + 4
    margins = [np.zeros(5), np.zeros(3)]
    with pytest.raises(ValueError, match="for 7 generated positions"):
        teacher_forced.position_table("r", "a", gen, preds, margins, preds, margins, [2, 0])
    with pytest.raises(ValueError, match="1 sequences of ref_argmax predictions for 2 prompts"):
        teacher_forced.position_table("r", "a", gen, preds[:1], margins, preds, margins, [0, 0])
    short = ScoreResult([[1, 2, 3]])
    short.append([1, 2, 3], [[1], [2], [3]], [[0.0], [0.0], [0.0]], [1.0, 1.0, 1.0], [2, 3, -1], [0.0, 0.0, math.nan])
    with pytest.raises(ValueError, match=r"sequences \[0\] are shorter than their prompt and generated tokens"):
        teacher_forced.scores_table("r", "a", short, short, [0], [3])  # 1 prompt + 3 generated: 4 tokens
    assert teacher_forced.scores_table("r", "a", short, short, [0], [2]).column("ref_token").to_pylist() == [2, 3]


def test_committed_file_holds_the_same_values(unit: dict[str, Any], tmp_path: Any) -> None:
    """Through the store: the file's rows are the built table's, bit for bit; floating-point columns
    are written without a dictionary, the others with one."""
    import pyarrow.parquet as pq

    from storage.store import ResultStore

    built = unit_table("teacher_forced", teacher_forced.run(unit["params"], unit["ctx"])["teacher_forced"], "u" * 20,
                       "cols")
    store = ResultStore(tmp_path)
    record = store.write("teacher_forced", "s", "u", built)
    back = pq.read_table(tmp_path / record.path)
    assert_bitwise_equal(back, built)
    meta = pq.read_metadata(tmp_path / record.path)
    for i, name in enumerate(meta.schema.names):
        encodings = meta.row_group(0).column(i).encodings
        if name in ("ref_margin", "arm_margin", *teacher_forced.DISTRIBUTION):
            assert "RLE_DICTIONARY" not in encodings and "PLAIN_DICTIONARY" not in encodings, name
        elif name != "flip":  # Parquet has no dictionary for booleans
            assert "RLE_DICTIONARY" in encodings or "PLAIN_DICTIONARY" in encodings, (name, encodings)
