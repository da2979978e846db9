"""The teacher_forced kind's distribution columns (``ref_token_prob_ref``, ``ref_token_prob_arm``,
``kl_ref_arm``, ``k3_ref_arm``): each value against an oracle computed at 60 significant digits with
mpmath from the same fp32 logits; equal logits give exactly 0; and a real tiny-model unit writes them
for every generated position, consistent with its flips and margins.
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.kinds import teacher_forced as tf


def oracle(ref: np.ndarray, arm: np.ndarray, tokens: np.ndarray) -> dict[str, list[float]]:
    """The four columns from fp32 logits, in 60-digit arithmetic (mpmath), rounded once at the end."""
    out: dict[str, list[float]] = {c: [] for c in tf.DISTRIBUTION}
    with mpmath.workdps(60):
        for r, a, t in zip(ref, arm, tokens, strict=True):
            rr = [mpmath.mpf(float(x)) for x in r]
            aa = [mpmath.mpf(float(x)) for x in a]
            zr = mpmath.log(mpmath.fsum(mpmath.exp(x) for x in rr))
            za = mpmath.log(mpmath.fsum(mpmath.exp(x) for x in aa))
            lr = [x - zr for x in rr]
            la = [x - za for x in aa]
            kl = mpmath.fsum(mpmath.exp(p) * (p - q) for p, q in zip(lr, la, strict=True))
            log_r = la[int(t)] - lr[int(t)]
            out["ref_token_prob_ref"].append(float(mpmath.exp(lr[int(t)])))
            out["ref_token_prob_arm"].append(float(mpmath.exp(la[int(t)])))
            out["kl_ref_arm"].append(float(kl))
            out["k3_ref_arm"].append(float(mpmath.exp(log_r) - 1 - log_r))
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 40), st.integers(1, 4),
       st.sampled_from([1e-6, 1e-3, 0.1, 1.0]), st.sampled_from([1.0, 5.0, 20.0]))
def test_columns_match_a_60_digit_oracle(seed: int, vocab: int, positions: int, delta: float, scale: float) -> None:
    rng = np.random.default_rng(seed)
    ref = (scale * rng.standard_normal((positions, vocab))).astype(np.float32)
    arm = (ref + delta * rng.standard_normal((positions, vocab))).astype(np.float32)
    tokens = rng.integers(0, vocab, positions)
    got = tf.distribution_arrays(ref, arm, tokens)
    want = oracle(ref, arm, tokens)
    for c in ("ref_token_prob_ref", "ref_token_prob_arm"):
        np.testing.assert_allclose(got[c], want[c], rtol=1e-13, atol=0)
    # KL and k3 are differences of nearby numbers: bounded by float64 rounding of log-probabilities
    # of size ~scale (absolute), relative to the value where it is large
    tol = 1e-14 * (scale + 1) * 8
    np.testing.assert_allclose(got["kl_ref_arm"], want["kl_ref_arm"], rtol=1e-9, atol=tol)
    np.testing.assert_allclose(got["k3_ref_arm"], want["k3_ref_arm"], rtol=1e-9, atol=tol)
    assert (got["k3_ref_arm"] >= 0).all()


def test_equal_logits_give_exact_zeros_and_bad_shapes_are_refused() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 17)).astype(np.float32)
    got = tf.distribution_arrays(x, x.copy(), [0, 5, 16])
    assert (got["kl_ref_arm"] == 0).all() and (got["k3_ref_arm"] == 0).all()
    assert np.array_equal(got["ref_token_prob_ref"], got["ref_token_prob_arm"])
    with pytest.raises(ValueError, match="both must be"):
        tf.distribution_arrays(x, x[:, :5], [0, 1, 2])
    with pytest.raises(ValueError, match="reference tokens for 3 positions"):
        tf.distribution_arrays(x, x, [0, 1])


def test_older_rows_get_null_columns_and_lengths_are_checked() -> None:
    table = tf.position_table("r", "a", [[1, 2]], [[1, 2]], [[0.5, 0.5]], [[1, 3]], [[0.5, 0.5]])
    nulls = tf.with_distribution(table, None)
    assert nulls.column_names[-4:] == list(tf.DISTRIBUTION)
    assert all(nulls.column(c).null_count == 2 for c in tf.DISTRIBUTION)
    with pytest.raises(ValueError, match="1 values of ref_token_prob_ref for 2 positions"):
        tf.with_distribution(table, {c: np.zeros(1) for c in tf.DISTRIBUTION})


@pytest.mark.slow
def test_a_tiny_model_unit_writes_the_columns_its_logits_give() -> None:
    """A real unit (cutlass reference, triton pow2 arm, 3 prompts x 10 tokens): every position has the
    four columns; p_ref is the softmax of the reference arm's own logits at the reference token; a
    flip never happens where both arms give the reference token probability above 1/2."""
    from tasks.kinds import generate
    from tasks.models.arms import build_arm_model
    from tasks.prompts import prompts_from_payload
    from tests.test_teacher_forced_columns import FakeContext

    exp = generate.GenerateExperiment.model_validate({
        "kind": "generate", "restarts": 1, "max_new_tokens": 10, "prompts": {"count": 3, "length": 6, "seed": 2},
        "arms": {"cutlass": {"kernel": "int8-cutlass-order", "scales": "real"},
                 "triton": {"kernel": "int8-triton-order", "scales": "pow2"}},
        "teacher_forced": [{"reference": "cutlass", "arms": ["triton"]}]})
    units = generate.expand("kind", exp)
    gen_unit = next(u for u in units if u.kind == "generate" and u.params["arm"]["name"] == "cutlass")
    tf_unit = next(u for u in units if u.kind == "teacher_forced")
    produced = generate.run(gen_unit.params)
    ctx: Any = FakeContext({"sequences": {gen_unit.id: produced["sequences"]}})
    got = tf.run(tf_unit.params, ctx)["teacher_forced"]
    assert isinstance(got, pa.Table)
    cols: dict[str, Any] = {c: got.column(c).to_numpy() for c in got.column_names if c not in ("ref_arm", "arm")}
    assert got.num_rows == 30 and all(got.column(c).null_count == 0 for c in tf.DISTRIBUTION)

    params = tf_unit.params
    ref_model = build_arm_model({**params, "arm": params["reference"]})
    prompts = prompts_from_payload(params["prompts"], int(ref_model.config.vocab_size))
    seqs = sorted(produced["sequences"], key=lambda r: r["prompt_index"])
    want_p = []
    for p, s in zip(prompts, seqs, strict=True):
        seq = p + list(s["tokens"])
        logits = ref_model.forward_tokens([seq])[0].double().numpy()
        f = len(p) - 1
        for k, tok in enumerate(s["tokens"]):
            row = logits[f + k]
            want_p.append(float(np.exp(row[tok] - np.logaddexp.reduce(row))))
    np.testing.assert_allclose(cols["ref_token_prob_ref"], want_p, rtol=1e-12)
    assert (cols["kl_ref_arm"] >= -1e-15).all() and (cols["k3_ref_arm"] >= 0).all()
    sure = (cols["ref_token_prob_ref"] > 0.5) & (cols["ref_token_prob_arm"] > 0.5)
    assert not (cols["flip"] & sure).any()
