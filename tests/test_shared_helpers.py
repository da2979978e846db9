"""Helpers shared across tasks: the stable seed, format name -> torch dtype, check CLI options."""

from __future__ import annotations

import hashlib

import pytest
import torch

from orchestrator.cli.check_options import Dtype, Scales, parse_dtype
from tasks.checks import operands
from tasks.numerics.formats import torch_dtype
from tasks.seeds import stable_seed


def test_stable_seed_never_changes() -> None:
    parts = ("tiny-qwen3", 0, "model.embed_tokens.weight")
    want = int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)
    assert stable_seed(*parts) == want == 1906081747274985094
    assert stable_seed() == 2599917437774673966
    assert 0 <= stable_seed("x", 1.5, None) < 2**63
    g = operands.generator(*parts)
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=torch.Generator().manual_seed(want)))


@pytest.mark.parametrize(
    "name,dtype",
    [("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("fp16", torch.float16), ("float16", torch.float16),
     ("half", torch.float16), ("fp32", torch.float32), ("float32", torch.float32),
     ("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2), ("torch.bfloat16", torch.bfloat16)],
)  # fmt: skip
def test_torch_dtype_names(name: str, dtype: torch.dtype) -> None:
    assert torch_dtype(name) is dtype


def test_torch_dtype_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid names: fp32, bf16, fp16"):
        torch_dtype("int4")


def test_check_cli_choices() -> None:
    assert tuple(s.value for s in Scales) == operands.SCALE_MODES
    for spelling, want in [("bf16", "bfloat16"), ("BFloat16", "bfloat16"), ("torch.float16", "float16"),
                           ("half", "float16"), ("fp32", "float32"), ("float32", "float32")]:  # fmt: skip
        assert parse_dtype(spelling) is Dtype(want)
