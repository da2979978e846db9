"""The options of AttentionAlgorithm's bound methods: ``dtype``, ``standard``, ``flush_to_zero``.

Every kernel here is emulated exactly (tasks.numerics.attention_emulate): a kernel that computes in
bf16, and a kernel whose every operation flushes subnormal results to zero (an arithmetic of the
emulator's with a flush after each rounding, registered for the test). The bounds are centred on the
exact result; the exact reference (attention_reference, fractions and 60-digit exp/log) is checked
to be covered by each option as well.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from tasks.numerics import attention_emulate as em
from tasks.numerics.attention import COMPUTE_DTYPES, STANDARDS, AttentionAlgorithm
from tasks.numerics.attention_emulate import AttentionKernel, exact_attention
from tasks.numerics.formats import FloatFormat, get_format


def _flush(x: Any, f: FloatFormat) -> np.ndarray:
    """Subnormal results of ``f`` become zero of the same sign (a flushing unit's behaviour)."""
    x = np.asarray(x, dtype=np.float64)
    return np.asarray(np.where(np.abs(x) < f.min_normal, np.copysign(0.0, x), x))


class _FlushArith(em._Fast):
    """The emulator's float64 arithmetic (each operation rounded once to its format), every result
    then flushed: subnormal results of every operation are zero."""

    def rnd(self, x: Any, f: FloatFormat) -> np.ndarray:
        return _flush(super().rnd(x, f), f)

    def add(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return _flush(super().add(x, y, f), f)

    def sub(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return _flush(super().sub(x, y, f), f)

    def mul(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return _flush(super().mul(x, y, f), f)

    def div(self, x: Any, y: Any, f: FloatFormat) -> np.ndarray:
        return _flush(super().div(x, y, f), f)

    def fma(self, acc: Any, a: Any, b: Any, f: FloatFormat) -> np.ndarray:
        return _flush(super().fma(acc, a, b, f), f)

    def exp(self, x: Any, f: FloatFormat, base2: bool = False) -> np.ndarray:
        return _flush(super().exp(x, f, base2), f)

    def log(self, x: Any, f: FloatFormat, base2: bool = False) -> np.ndarray:
        return _flush(super().log(x, f, base2), f)


@pytest.fixture
def flushing(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(em._ARITH, "flush", _FlushArith())
    return "flush"


@dataclass(frozen=True)
class _ComputeKernel(AttentionKernel):
    """An emulated kernel whose compute format (scale, subtraction, exp, normalisation, logsumexp)
    and, by default, accumulation format is ``compute``."""

    compute: str = "fp32"

    def _fmts(self) -> tuple[FloatFormat, FloatFormat, FloatFormat | None, FloatFormat | None]:
        c = get_format(self.compute)
        a = get_format(self.accumulate) if self.accumulate else c
        w = get_format(self.weights) if self.weights else None
        b = get_format(self.bias) if self.bias else None
        return c, a, w, b

    def _normalise(self, ar: Any, num: Any, z: Any) -> Any:
        c = get_format(self.compute)
        if self.reciprocal:
            return ar.mul(num, ar.div(ar.zeros(np.shape(z)) + 1, z, c), c)
        return ar.div(num, z, c)

    def _lse(self, ar: Any, m: Any, z: Any) -> Any:
        c = get_format(self.compute)
        return ar.rnd(ar.add(m, ar.log(z, c), c), get_format("fp32"))


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32, mul: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * mul).to(dtype)


# -- dtype ----------------------------------------------------------------------------------------

def test_bf16_compute_is_covered_with_dtype_bf16_and_not_with_fp32() -> None:
    q, k, v = (_randn(1, 2, 6, 16, seed=s, dtype=torch.bfloat16, mul=m) for s, m in ((1, 2.0), (2, 2.0), (3, 1.0)))
    alg = AttentionAlgorithm()
    for kern in (_ComputeKernel("bf16-math", normalize="first", compute="bf16"),
                 _ComputeKernel("bf16-flash", online_softmax=True, block_size=2, compute="bf16")):
        res = kern.forward(q, k, v)
        algo = AttentionAlgorithm(online_softmax=kern.online_softmax, block_size=kern.block_size)
        assert algo.covers(res.out, q, k, v, logsumexp=res.logsumexp, dtype="bf16").all(), kern.name
        assert not algo.covers(res.out, q, k, v, logsumexp=res.logsumexp).all(), kern.name
    # the same kernel computing in fp32 is covered at fp32; the bf16 bound is the wider one
    res32 = _ComputeKernel("fp32-math", normalize="first").forward(q, k, v)
    assert alg.covers(res32.out, q, k, v, logsumexp=res32.logsumexp).all()
    assert np.all(alg.tolerance(q, k, v, dtype="bf16").out > alg.tolerance(q, k, v).out)


def test_fp32_inputs_into_a_bf16_kernel_are_charged_their_conversion() -> None:
    q, k, v = (_randn(1, 1, 5, 8, seed=s) for s in (4, 5, 6))
    kern = _ComputeKernel("bf16", normalize="first", compute="bf16")
    qb, kb, vb = (x.to(torch.bfloat16).float() for x in (q, k, v))  # what the kernel reads
    res = kern.forward(qb, kb, vb)
    alg = AttentionAlgorithm()
    assert alg.covers(res.out, q, k, v, logsumexp=res.logsumexp, dtype="bf16").all()
    assert not alg.covers(res.out, q, k, v).all()
    with pytest.raises(ValueError, match="backward bounds for inputs .* compute format bf16 are not derived"):
        alg.backward_tolerance(q, k, v, _randn(1, 1, 5, 8, seed=7), dtype="bf16")


def test_fp64_compute_and_the_exact_reference() -> None:
    q, k, v = (_randn(1, 1, 4, 8, seed=s) for s in (8, 9, 10))
    alg = AttentionAlgorithm()
    exact = exact_attention(q, k, v)
    t64, t32 = alg.tolerance(q, k, v, dtype="fp64"), alg.tolerance(q, k, v)
    assert np.all(t64.out <= t32.out) and np.all(t64.out < t32.out)  # fp64 compute: only the output rounding is left
    for opts in ({"dtype": "fp64"}, {"dtype": torch.float64}, {"dtype": "bf16"}, {"standard": "sequential"},
                 {"flush_to_zero": True}):
        assert alg.covers(exact.out, q, k, v, logsumexp=exact.logsumexp, **opts).all(), opts


@pytest.mark.parametrize(("opts", "match"), [
    ({"dtype": "fp16"}, "dtype fp16: allowed compute formats fp32, bf16, fp64"),
    ({"dtype": "int8"}, "dtype 'int8': allowed compute formats fp32, bf16, fp64"),
    ({"standard": "ieee"}, "standard must be one of any-order, sequential, got 'ieee'"),
    ({"flush_to_zero": 1}, "flush_to_zero must be True or False"),
])
def test_bad_options_are_refused(opts: dict[str, Any], match: str) -> None:
    q = _randn(1, 3, 4, seed=0)
    with pytest.raises(ValueError, match=match):
        AttentionAlgorithm().tolerance(q, q, q, **opts)
    assert COMPUTE_DTYPES == ("fp32", "bf16", "fp64") and STANDARDS == ("any-order", "sequential")


# -- standard -------------------------------------------------------------------------------------

def test_sequential_standard_is_tighter_and_covers_the_written_order() -> None:
    q, k, v = (_randn(2, 7, 12, seed=s, mul=1.5) for s in (11, 12, 13))
    alg = AttentionAlgorithm()
    seq, anyo = alg.tolerance(q, k, v, standard="sequential"), alg.tolerance(q, k, v)
    assert np.all(seq.out <= anyo.out) and np.any(seq.out < anyo.out)
    assert np.all(seq.logsumexp <= anyo.logsumexp)
    kern = AttentionKernel("math", normalize="first")  # keys and features summed in index order
    res = kern.forward(q, k, v)
    assert alg.covers(res.out, q, k, v, logsumexp=res.logsumexp, standard="sequential").all()
    # with online_softmax both standards give the any-order bound (the seed)
    online = AttentionAlgorithm(online_softmax=True, block_size=4)
    a, b = online.tolerance(q, k, v, standard="sequential"), online.tolerance(q, k, v)
    assert np.array_equal(a.out, b.out) and np.array_equal(a.logsumexp, b.logsumexp)
    g = _randn(2, 7, 12, seed=14)
    grads = kern.backward(q, k, v, g)
    assert alg.backward_covers(grads, q, k, v, g, standard="sequential").all()


# -- flush_to_zero --------------------------------------------------------------------------------

def _subnormal_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Equal logits over 8 keys (q = 0: every weight 1/8) and values 2^-125 (normal in fp32): each
    weighted value 2^-128 is an fp32 subnormal, so a flushing kernel's output is 0, not 2^-125."""
    q = torch.zeros(1, 3, 4)
    k = _randn(1, 8, 4, seed=15)
    v = torch.full((1, 8, 4), 2.0**-125) * torch.tensor([1.0, -1.0, 1.5, 1.0])
    return q, k, v


def test_a_flushing_kernel_is_covered_only_with_flush_to_zero(flushing: str) -> None:
    q, k, v = _subnormal_case()
    kern = AttentionKernel("math", normalize="first")
    res = kern.forward(q, k, v, arith=flushing)
    assert np.all(res.out == 0) and np.all(np.abs(exact_attention(q, k, v).out) >= 2.0**-125)
    alg = AttentionAlgorithm()
    assert alg.covers(res.out, q, k, v, logsumexp=res.logsumexp, flush_to_zero=True).all()
    assert not alg.covers(res.out, q, k, v, logsumexp=res.logsumexp).out.any()
    # the same kernel with gradual underflow is covered either way
    plain = kern.forward(q, k, v)
    assert alg.covers(plain.out, q, k, v).all() and alg.covers(plain.out, q, k, v, flush_to_zero=True).all()
    # its backward: dv = P^T dO with dO of 2^-124 gives subnormal products too
    g = torch.full((1, 3, 4), 2.0**-124)
    grads = kern.backward(q, k, v, g, arith=flushing)
    assert alg.backward_covers(grads, q, k, v, g, flush_to_zero=True).all()
    assert not alg.backward_covers(grads, q, k, v, g).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flushing_kernels_are_covered_on_ordinary_inputs(flushing: str, dtype: torch.dtype) -> None:
    q, k, v = (_randn(1, 2, 5, 8, seed=s, dtype=dtype, mul=3.0) for s in (16, 17, 18))
    for kern in (AttentionKernel("math", normalize="first"),
                 AttentionKernel("flash", online_softmax=True, block_size=2, reciprocal=True)):
        res = kern.forward(q, k, v, arith=flushing)
        algo = AttentionAlgorithm(online_softmax=kern.online_softmax, block_size=kern.block_size,
                                  reciprocal=kern.reciprocal)
        assert algo.covers(res.out, q, k, v, logsumexp=res.logsumexp, flush_to_zero=True).all(), kern.name


def test_subnormal_inputs_are_flushed_inputs() -> None:
    q, k, _ = _subnormal_case()
    v = torch.full((1, 8, 4), 2.0**-130)  # fp32 subnormals: a flushing kernel reads them as 0
    alg = AttentionAlgorithm()
    assert alg.covers(torch.zeros(1, 3, 4), q, k, v, flush_to_zero=True).all()
    assert not alg.covers(torch.zeros(1, 3, 4), q, k, v).out.any()


# -- swapcheck check attention --------------------------------------------------------------------

def _bf16_inside(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 in and out, every step in between in bf16: a silent precision downgrade."""
    qb, kb, vb = q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)
    s = (qb @ kb.transpose(-1, -2)) * torch.tensor(scale, dtype=torch.bfloat16)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(torch.bfloat16)
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    return (torch.softmax(s, dim=-1) @ vb).to(q.dtype), torch.logsumexp(s.float(), dim=-1)


@pytest.fixture
def bf16_inside() -> Any:
    from tasks.attention import registry as reg

    kernel = reg.AttentionKernel(name="opts-bf16-inside", device="cpu", compute=_bf16_inside,
                                 description="fp32 in and out, bf16 inside", logsumexp="alongside")
    reg.register_attention(kernel)
    yield kernel
    reg._unregister("opts-bf16-inside")


def test_check_attention_cli_takes_the_options(bf16_inside: Any) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    runner = CliRunner()
    base = ["check", "attention", "--kernel", "opts-bf16-inside", "--shape", "1x2x8x12x16", "--inputs", "randn,alibi",
            "--trials", "1", "--format", "json"]
    fp32 = runner.invoke(app, base)
    assert fp32.exit_code == 1 and json.loads(fp32.stdout)["verdict"] == "INCORRECT", fp32.output
    bf16 = runner.invoke(app, [*base, "--compute-dtype", "bf16"])
    assert bf16.exit_code == 0, bf16.output
    obj = json.loads(bf16.stdout)
    assert obj["passed"] is True and obj["settings"]["compute_dtype"] == "bf16"
    assert (obj["settings"]["standard"], obj["settings"]["flush_to_zero"]) == ("any-order", False)
    ftz = runner.invoke(app, [*base[:-2], "--kernel", "sdpa-math", "--flush-to-zero", "--standard", "sequential"])
    assert ftz.exit_code == 0, ftz.output
    bad = runner.invoke(app, [*base, "--standard", "ieee"])
    assert bad.exit_code == 2 and "--standard 'ieee': allowed any-order, sequential" in bad.output
    bad = runner.invoke(app, [*base, "--compute-dtype", "fp16"])
    assert bad.exit_code == 2 and "--compute-dtype 'fp16': allowed fp32, bf16, fp64" in bad.output
