"""The registry's rule for plain callables: f(A, B) -> C is a matmul kernel, f() a factory."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
import torch

import tasks.kernels.registry as reg
from tasks.kernels import (
    Kernel,
    KernelError,
    MatmulKernel,
    get_kernel,
    list_kernels,
    register_kernel,
)


@pytest.fixture
def scratch_names():
    names: list[str] = []
    yield names
    for n in names:
        reg._unregister(n)


def _int8(m=5, k=7, n=3):
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-5, 6, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-5, 6, (k, n), generator=g, dtype=torch.int8)
    return a, b


def test_module_attr_function_is_a_matmul_kernel():
    k = get_kernel("_planted_kernels:correct")
    assert isinstance(k, MatmulKernel) and isinstance(k, Kernel)
    assert k.name == "_planted_kernels:correct"
    assert "plain matmul callable _planted_kernels:correct" in k.description
    a = torch.randn(4, 9).bfloat16()
    b = torch.randn(9, 6).bfloat16()
    assert torch.equal(k.matmul(a, b), (a.float() @ b.float()).bfloat16())


def test_builtin_without_signature_is_a_matmul_kernel():
    with pytest.raises(KernelError, match="holds no swapcheck kernels"):
        get_kernel("torch:matmul")  # unmarked, and torch is never a kernel module
    k = get_kernel("_planted_kernels:torch_matmul")  # kernel_function(torch.matmul) in the user's module
    assert isinstance(k, MatmulKernel)
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    assert torch.equal(k.matmul(a, b), a @ b)


def test_shared_call_with_unit_scales_and_refusal_otherwise():
    k = get_kernel("_planted_kernels:correct")
    a, b = _int8()
    one = torch.ones(1)
    out = k(a, b, one, one, torch.float32)
    assert torch.equal(out, (a.double() @ b.double()).float())
    with pytest.raises(KernelError, match="only unit scales"):
        k(a, b, torch.full((1,), 0.5), one, torch.float32)
    with pytest.raises(KernelError, match="bias=None"):
        k(a, b, one, one, torch.float32, torch.zeros(3))


def test_wrong_output_shape_through_the_shared_call():
    k = get_kernel("_planted_kernels:wrong_shape")
    a, b = _int8()
    with pytest.raises(KernelError, match=r"must return a tensor of shape \[5, 3\]"):
        k(a, b, torch.ones(1), torch.ones(1), torch.bfloat16)


def test_keyword_parameters_are_passed_and_checked():
    k = get_kernel("_planted_kernels:blocked", block=16)
    assert k.params == {"block": 16}
    assert k.identity["callable"] == "_planted_kernels:blocked"
    with pytest.raises(KernelError, match="does not accept parameters"):
        get_kernel("_planted_kernels:blocked", tile=3)


def test_wrong_signature_is_a_clear_error():
    with pytest.raises(KernelError, match="3 required positional parameter"):
        get_kernel("_planted_kernels:three_args")
    with pytest.raises(KernelError, match="cannot import module 'no_such_module_q'"):
        get_kernel("no_such_module_q:f")
    with pytest.raises(KernelError, match="has no attribute"):
        get_kernel("_planted_kernels:nothing_here")


def test_factory_still_a_factory():
    k = get_kernel("_user_kernels:make_float_reference", offset=1.0)
    assert not isinstance(k, MatmulKernel) and k.params == {"offset": 1.0}


def test_registered_and_entry_point_callables(monkeypatch, scratch_names):
    from _planted_kernels import correct

    register_kernel("test-plain", correct)
    scratch_names.append("test-plain")
    assert isinstance(get_kernel("test-plain"), MatmulKernel)
    eps = [EntryPoint("test-plain-ep", "_planted_kernels:tile_scaled", reg.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(reg.metadata, "entry_points", lambda group: eps)
    monkeypatch.setattr(reg, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(reg, "_REFUSED_ENTRY_POINTS", {})
    scratch_names.append("test-plain-ep")
    k = get_kernel("test-plain-ep")
    assert isinstance(k, MatmulKernel) and k.name == "test-plain-ep"
    row = next(r for r in list_kernels() if r["name"] == "test-plain-ep")
    assert row["available"] and row["operand_dtype"] == "any"
