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


@pytest.mark.parametrize("raw,ok", [("", 7.0), ("  ", 7.0), ("0", 0.0), ("12.5", 12.5), ("3600", 3600.0),
                                    ("-1", None), ("3601", None), ("nan", None), ("inf", None), ("ten", None)])
def test_seconds_from_env_takes_a_bounded_number_or_names_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                                      raw: str, ok: float | None) -> None:
    from swapcheck_common.env import seconds_from_env
    from swapcheck_common.errors import InputError

    monkeypatch.setenv("SWAPCHECK_X_S", raw)
    if ok is not None:
        assert seconds_from_env("SWAPCHECK_X_S", 7.0, 0.0, 3600.0) == ok
        return
    with pytest.raises(InputError, match=r"SWAPCHECK_X_S=.*between 0 and 3600 \(default 7\)"):
        seconds_from_env("SWAPCHECK_X_S", 7.0, 0.0, 3600.0)


def test_a_bad_stop_grace_is_refused_before_a_launch_writes_anything(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app
    from tests.conftest import tiny_spec_text

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_spec_text(name="grace"))
    monkeypatch.setenv("SWAPCHECK_STOP_GRACE_S", "soon")
    res = CliRunner().invoke(app, ["sweep", "launch", str(spec), "--results", str(tmp_path / "r"), "--no-progress"])
    assert res.exit_code == 2 and "SWAPCHECK_STOP_GRACE_S='soon'" in res.output, res.output
    assert not (tmp_path / "r").exists()
