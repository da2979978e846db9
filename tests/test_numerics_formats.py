"""Format descriptors: derived constants against torch.finfo / ml_dtypes.finfo, aliases, bit layout."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from tasks.numerics import FORMATS, FloatFormat, get_format, is_representable

ALL = list(FORMATS.values())
IDS = [f.name for f in ALL]


@pytest.mark.parametrize("f", ALL, ids=IDS)
def test_constants_match_torch_finfo(f: FloatFormat) -> None:
    fi = torch.finfo(f.torch_dtype)
    assert f.bits == fi.bits
    assert f.max_finite == fi.max
    assert -f.max_finite == fi.min
    assert f.min_normal == fi.smallest_normal == fi.tiny
    assert f.eps == fi.eps
    assert f.unit_roundoff == fi.eps / 2
    # torch.finfo has no smallest_subnormal; ml_dtypes.finfo (and numpy's for fp32/fp16) does.
    assert f.min_subnormal == float(ml_dtypes.finfo(f.numpy_dtype).smallest_subnormal)
    assert f.min_subnormal == f.min_normal * f.eps


@pytest.mark.parametrize("f", ALL, ids=IDS)
def test_layout_and_dtypes(f: FloatFormat) -> None:
    assert f.bits == 1 + f.exponent_bits + f.mantissa_bits
    assert f.precision == f.mantissa_bits + 1
    assert f.numpy_dtype.itemsize * 8 == f.bits
    assert f.int_dtype.itemsize * 8 == f.bits and f.int_dtype.kind == "u"
    assert torch.empty(0, dtype=f.torch_dtype).element_size() * 8 == f.bits
    assert get_format(f.torch_dtype) is f
    assert get_format(f.numpy_dtype) is f
    # Bit patterns: the smallest subnormal is pattern 1, max_finite is max_finite_bits, the next
    # pattern up is inf (IEEE) or NaN (e4m3fn), and the pattern after the top non-NaN one is NaN.
    decode = lambda b: float(np.array([b], dtype=f.int_dtype).view(f.numpy_dtype)[0])  # noqa: E731
    assert decode(1) == f.min_subnormal
    assert decode(1 << f.mantissa_bits) == f.min_normal
    assert decode(f.max_finite_bits) == f.max_finite
    assert decode(f.top_non_nan_bits) == (np.inf if f.has_inf else f.max_finite)
    assert np.isnan(decode(f.top_non_nan_bits + 1))
    assert decode(f.sign_mask | f.max_finite_bits) == -f.max_finite


EXACT_INTEGER = {"fp32": 2**24, "bf16": 256, "fp16": 2048, "fp8_e4m3fn": 16, "fp8_e5m2": 8}


@pytest.mark.parametrize("name,n", EXACT_INTEGER.items())
def test_max_exact_integer(name: str, n: int) -> None:
    """numerics.md §1: every integer 0..N is exact, N + 1 is the first that is not."""
    f = FORMATS[name]
    assert f.max_exact_integer == n
    ints = np.arange(min(n, 4096) + 1, dtype=np.float64)
    assert is_representable(ints, f).all()
    assert is_representable(float(n), f)
    assert not is_representable(float(n + 1), f)
    # the same facts through the real dtypes
    assert float(np.float64(n + 1).astype(f.numpy_dtype)) != n + 1
    assert float(np.float64(n).astype(f.numpy_dtype)) == n


def test_specific_values() -> None:
    assert FORMATS["fp16"].max_finite == 65504
    assert FORMATS["fp8_e4m3fn"].max_finite == 448
    assert FORMATS["fp8_e5m2"].max_finite == 57344
    assert FORMATS["bf16"].eps == 2**-7 and FORMATS["bf16"].unit_roundoff == 2**-8
    assert FORMATS["fp8_e4m3fn"].min_subnormal == 2**-9
    assert FORMATS["bf16"].min_subnormal == 2**-133
    assert FORMATS["fp32"].min_subnormal == 2**-149
    assert FORMATS["fp16"].min_subnormal == 2**-24
    assert not FORMATS["fp8_e4m3fn"].has_inf
    assert all(f.has_inf for f in ALL if f.name != "fp8_e4m3fn")


@pytest.mark.parametrize(
    "alias,name",
    [
        ("fp32", "fp32"),
        ("float32", "fp32"),
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("e4m3", "fp8_e4m3fn"),
        ("fp8_e4m3", "fp8_e4m3fn"),
        ("float8_e4m3fn", "fp8_e4m3fn"),
        ("torch.float8_e4m3fn", "fp8_e4m3fn"),
        ("e5m2", "fp8_e5m2"),
        ("float8_e5m2", "fp8_e5m2"),
        (torch.float32, "fp32"),
        (torch.bfloat16, "bf16"),
        (torch.half, "fp16"),
        (torch.float8_e4m3fn, "fp8_e4m3fn"),
        (torch.float8_e5m2, "fp8_e5m2"),
        (np.float32, "fp32"),
        (np.dtype(np.float16), "fp16"),
        (ml_dtypes.bfloat16, "bf16"),
        (np.dtype(ml_dtypes.float8_e4m3fn), "fp8_e4m3fn"),
        (ml_dtypes.float8_e5m2, "fp8_e5m2"),
    ],
)
def test_get_format_aliases(alias: object, name: str) -> None:
    assert get_format(alias) is FORMATS[name]  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["fp64", "float64", "int8", "e4m3fnuz", torch.float64, np.int8, 3])
def test_get_format_unknown(bad: object) -> None:
    with pytest.raises(ValueError, match="valid names: fp32, bf16, fp16, fp8_e4m3fn, fp8_e5m2"):
        get_format(bad)  # type: ignore[arg-type]


def test_formats_are_frozen() -> None:
    with pytest.raises(AttributeError):
        FORMATS["bf16"].mantissa_bits = 8  # type: ignore[misc]
    assert str(FORMATS["bf16"]) == "bf16"


def test_docs_example_runs() -> None:
    """docs/numerics.md's example is executable and stays true."""
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "numerics.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, str(doc), "exec"), {})
