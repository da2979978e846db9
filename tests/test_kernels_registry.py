"""The kernel registry and the shared call contract (tasks/kernels/registry.py, operands.py)."""

from __future__ import annotations

import os
import sys
from importlib.metadata import EntryPoint

import pytest
import torch

from tasks.kernels import (
    Kernel,
    KernelError,
    get_kernel,
    kernel_names,
    list_kernels,
    register_kernel,
)
from tasks.kernels import registry as reg

BUILTINS = {
    "exact",
    "fp8-blocked",
    "fp8-pairwise",
    "fp8-sequential",
    "fp8-torch-scaled-mm",
    "int8-cutlass-order",
    "int8-onednn",
    "int8-torch-channelwise",
    "int8-triton-order",
}


@pytest.fixture
def scratch_names():
    """Names registered by a test are removed afterwards."""
    names: list[str] = []
    yield names
    for n in names:
        reg._unregister(n)


def operands(dtype: torch.dtype, m: int = 3, k: int = 5, n: int = 4):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.int8:
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
        b = torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=g)
    else:
        a = (torch.randn(m, k, generator=g) * 4).to(dtype)
        b = (torch.randn(k, n, generator=g) * 4).to(dtype)
    return a, b, torch.tensor(0.5), torch.full((n,), 0.25)


# -- names, lookup, errors ---------------------------------------------------------------------


def test_builtins_registered_on_import():
    assert BUILTINS <= set(kernel_names())
    assert kernel_names() == sorted(kernel_names())


def test_duplicate_name_refused(scratch_names):
    with pytest.raises(KernelError, match="already registered"):
        register_kernel("exact", "_user_kernels:FloatReference")
    register_kernel("test-dup", "_user_kernels:FloatReference")
    scratch_names.append("test-dup")
    with pytest.raises(KernelError, match="already registered"):

        @register_kernel("test-dup")
        class Again(Kernel):
            pass


@pytest.mark.parametrize("bad", ["", "has space", "mod:attr", "-leading"])
def test_invalid_names_refused(bad):
    with pytest.raises(KernelError, match="invalid kernel name"):
        register_kernel(bad, "_user_kernels:FloatReference")


def test_unknown_name_did_you_mean_and_list():
    with pytest.raises(KernelError) as info:
        get_kernel("fp8-sequental")
    msg = str(info.value)
    assert "did you mean 'fp8-sequential'" in msg
    for name in BUILTINS:
        assert name in msg
    assert "module:attr" in msg
    assert isinstance(info.value, ValueError)


def test_unknown_name_without_close_match_still_lists():
    with pytest.raises(KernelError, match="allowed: .*exact") as info:
        get_kernel("zzzz")
    assert "did you mean" not in str(info.value)


def test_suffix_parameter():
    k = get_kernel("fp8-blocked-128")
    assert k == get_kernel("fp8-blocked", block_size=128) == get_kernel("fp8-blocked")
    assert k.name == "fp8-blocked-128" and k.params == {"block_size": 128, "epilogue": "cutlass"}
    assert get_kernel("fp8-blocked-32") != k
    assert get_kernel("fp8-blocked-32", epilogue="triton").params["epilogue"] == "triton"
    assert hash(get_kernel("fp8-blocked-32")) == hash(get_kernel("fp8-blocked", block_size=32))
    with pytest.raises(KernelError, match="also given"):
        get_kernel("fp8-blocked-128", block_size=64)
    with pytest.raises(KernelError, match="did you mean"):
        get_kernel("fp8-sequential-128")  # no suffix parameter declared there
    with pytest.raises(KernelError, match="block_size must be an integer >= 1"):
        get_kernel("fp8-blocked", block_size=0)


def test_bad_params():
    with pytest.raises(KernelError, match="unknown parameter.*block_sz.*block_size=128"):
        get_kernel("fp8-blocked", block_sz=4)
    with pytest.raises(KernelError, match="bias_mode='fp16' is not allowed.*'fp32', 'output'"):
        get_kernel("int8-triton-order", bias_mode="fp16")
    with pytest.raises(KernelError, match="allowed parameters .*: none"):
        get_kernel("exact", foo=1)


# -- lazy entries, user kernels, entry points -----------------------------------------------------


def test_lazy_module_attr_entry(scratch_names):
    sys.modules.pop("_user_kernels", None)
    register_kernel("test-lazy", "_user_kernels:FloatReference")
    scratch_names.append("test-lazy")
    assert "_user_kernels" not in sys.modules  # registering imports nothing
    assert "test-lazy" in kernel_names()
    k = get_kernel("test-lazy", offset=0.0)
    assert "_user_kernels" in sys.modules
    assert k.name == "test-lazy"
    a, b, sa, sb = operands(torch.int8)
    out = k(a, b, sa, sb, torch.float32)
    assert out.shape == (3, 4) and out.dtype == torch.float32


def test_lazy_entry_import_error(scratch_names):
    register_kernel("test-broken", "no_such_module_xyz:Thing")
    scratch_names.append("test-broken")
    with pytest.raises(KernelError, match="cannot import module 'no_such_module_xyz'"):
        get_kernel("test-broken")
    row = next(r for r in list_kernels() if r["name"] == "test-broken")
    assert row["available"] is False and "no_such_module_xyz" in row["reason"]


def test_direct_module_attr_name():
    k = get_kernel("_user_kernels:FloatReference")
    assert isinstance(k, Kernel) and k.name == "_user_kernels:FloatReference"
    f = get_kernel("_user_kernels:make_float_reference", offset=1.0)
    assert f.params == {"offset": 1.0}
    with pytest.raises(KernelError, match="has no attribute"):
        get_kernel("_user_kernels:Missing")
    with pytest.raises(KernelError, match="not a Kernel subclass"):
        get_kernel("_user_kernels:NOT_A_KERNEL")


def test_register_factory_and_instance(scratch_names):
    from _user_kernels import FloatReference, make_float_reference

    register_kernel("test-factory", make_float_reference)
    register_kernel("test-instance", FloatReference(offset=2.0))
    scratch_names += ["test-factory", "test-instance"]
    assert get_kernel("test-factory", offset=3.0).params["offset"] == 3.0
    assert get_kernel("test-instance").params["offset"] == 2.0
    with pytest.raises(KernelError, match="takes no parameters"):
        get_kernel("test-instance", offset=1.0)
    with pytest.raises(KernelError, match="expected a Kernel subclass"):
        register_kernel("test-bad-target", 42)


def test_entry_points(monkeypatch, scratch_names):
    eps = [
        EntryPoint("test-ep", "_user_kernels:FloatReference", reg.ENTRY_POINT_GROUP),
        EntryPoint("exact", "_user_kernels:FloatReference", reg.ENTRY_POINT_GROUP),  # clash
    ]
    monkeypatch.setattr(reg.metadata, "entry_points", lambda group: eps)
    monkeypatch.setattr(reg, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(reg, "_REFUSED_ENTRY_POINTS", {})
    scratch_names.append("test-ep")
    with pytest.warns(UserWarning, match="entry point exact=.* refused"):
        names = kernel_names()
    assert "test-ep" in names
    assert get_kernel("test-ep").name == "test-ep"
    assert type(get_kernel("exact")).__name__ == "Exact"  # a plugin never shadows a built-in
    row = next(r for r in list_kernels() if r["name"] == "test-ep")
    assert row["available"] and row["source"].startswith("entry point")


# -- list_kernels ---------------------------------------------------------------------------------


def test_list_kernels_fields():
    rows = {r["name"]: r for r in list_kernels()}
    assert BUILTINS <= set(rows)
    for name in BUILTINS:
        r = rows[name]
        assert {"name", "operand_dtype", "device", "available", "reason", "description"} <= set(r)
        assert r["operand_dtype"] in ("int8", "fp8_e4m3", "any")
        assert r["device"] == "cpu"
        assert isinstance(r["available"], bool)
        assert (r["reason"] is None) == r["available"]
        assert "§" in r["description"] or "numerics.md" in r["description"]
    assert rows["fp8-blocked"]["params"] == {"block_size": 128, "epilogue": "cutlass"}


# -- every built-in honours the call contract -------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILTINS))
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_builtin_runs(name, out_dtype):
    k = get_kernel(name)
    ok, reason = k.available()
    if not ok:
        pytest.skip(reason)
    dtypes = {"int8": [torch.int8], "fp8_e4m3": [torch.float8_e4m3fn]}.get(
        k.operand_dtype, [torch.int8, torch.float8_e4m3fn]
    )
    for dt in dtypes:
        a, b, sa, sb = operands(dt)
        bias = torch.linspace(-1, 1, 4).to(out_dtype)
        for bb in (None, bias):
            out = k(a, b, sa, sb, out_dtype, bb)
            assert out.shape == (3, 4) and out.dtype == out_dtype
            again = k(a, b, sa, sb, out_dtype, bb)
            assert torch.equal(out.view(torch.uint8), again.view(torch.uint8))  # deterministic


@pytest.mark.parametrize(
    "name, dtype",
    [("int8-cutlass-order", torch.float8_e4m3fn), ("fp8-sequential", torch.int8)],
)
def test_wrong_operand_dtype(name, dtype):
    a, b, sa, sb = operands(dtype)
    with pytest.raises(KernelError, match="takes operands of dtype"):
        get_kernel(name)(a, b, sa, sb, torch.bfloat16)


def test_bad_operands():
    k = get_kernel("int8-cutlass-order")
    a, b, sa, sb = operands(torch.int8)  # a [3,5], b [5,4]
    bf16 = torch.bfloat16
    cases = [
        ((a, b[:4], sa, sb, bf16), "inner dimensions differ"),
        ((a[0], b, sa, sb, bf16), "must be 2-D"),
        ((a.float(), b, sa, sb, bf16), "takes operands of dtype"),
        ((a, b, sa.double(), sb, bf16), "scale_a must be float32"),
        ((a, b, torch.ones(2), sb, bf16), "scale_a has 2 elements"),
        ((a, b, torch.ones(1, 3), sb, bf16), r"scale_a has shape \[1, 3\]"),
        ((a, b, sa, torch.ones(3), bf16), "scale_b has 3 elements"),
        ((a, b, sa, torch.ones(2, 2), bf16), r"scale_b has shape \[2, 2\]"),
        ((a, b, sa, torch.ones(4, 1, 1), bf16), r"scale_b has shape \[4, 1, 1\]"),
        ((a, b, torch.tensor(float("nan")), sb, bf16), "must be finite"),
        ((a, b, sa, sb, torch.int32), "out_dtype must be"),
        ((a, b, sa, sb, bf16, torch.zeros(4)), "bias must have the output dtype"),
        ((a, b, sa, sb, bf16, torch.zeros(5, dtype=bf16)), r"bias must have shape \[N\] = \[4\]"),
        ((a, b, sa, sb, bf16, torch.full((4,), float("inf"), dtype=bf16)), "bias must be finite"),
        ((a[:0], b, sa, sb, bf16), "empty problem"),
        ((a.tolist(), b, sa, sb, bf16), "must be a torch.Tensor"),
    ]
    for args, pattern in cases:
        with pytest.raises(KernelError, match=pattern):
            k(*args)


def test_accepted_scale_spellings_agree():
    k = get_kernel("int8-cutlass-order")
    a, b, _, _ = operands(torch.int8)
    ref = k(a, b, torch.tensor([0.5, 0.25, 0.125]).reshape(3, 1), torch.tensor(0.75), torch.float32)
    for sa in (torch.tensor([0.5, 0.25, 0.125]), torch.tensor([[0.5], [0.25], [0.125]])):
        for sb in (
            torch.tensor(0.75),
            torch.tensor([0.75]),
            torch.tensor([[0.75]]),
            torch.full((4,), 0.75),
            torch.full((1, 4), 0.75),
            torch.full((4, 1), 0.75),
        ):
            assert torch.equal(k(a, b, sa, sb, torch.float32), ref)


def test_fp8_nan_operand_refused():
    a, b, sa, sb = operands(torch.float8_e4m3fn)
    a = a.clone()
    a.view(torch.uint8)[0, 0] = 0x7F
    with pytest.raises(KernelError, match="contains NaN"):
        get_kernel("exact")(a, b, sa, sb, torch.bfloat16)


def test_unsupported_layout_is_kernel_error():
    k = get_kernel("int8-onednn")
    if not k.available()[0]:
        pytest.skip(k.available()[1])
    a, b, _, sb = operands(torch.int8)
    assert k.supports(3, 4, 5, 3, 4, False)[0] is False
    with pytest.raises(KernelError, match="per-tensor activation scale only"):
        k(a, b, torch.ones(3, 1), sb, torch.bfloat16)


def test_identity_and_repr():
    k = get_kernel("int8-triton-order", bias_mode="output")
    assert k.identity == {
        "name": "int8-triton-order",
        "version": "1",
        "params": {"bias_mode": "output"},
    }
    assert "int8-triton-order" in repr(k) and "output" in k.description


# -- only declared kernels: nothing else is called (specs are data) --------------------------------


@pytest.mark.parametrize(
    "ref,match",
    [
        ("subprocess:Popen", "standard library"),
        ("sys:exit", "standard library"),
        ("os:abort", "standard library"),
        ("builtins:eval", "standard library"),
        ("torch:matmul", "'torch' package"),
        ("numpy:matmul", "'numpy' package"),
        ("orchestrator.runner:launch", "'orchestrator' package"),
        ("_user_kernels:unmarked_matmul", "unmarked callable"),
        ("_user_kernels:unmarked_factory", "unmarked callable"),
        ("_user_kernels:NotAKernelClass", "class _user_kernels.NotAKernelClass"),
        ("_user_kernels:NOT_A_KERNEL", "not a Kernel subclass"),
        ("_user_kernels:torch.matmul", "unmarked callable"),
        ("_user_kernels:FloatReference.compute", "unmarked callable"),
        ("_user_kernels:__builtins__", "special attribute"),
        ("_user_kernels:IMPORTED.real", "only go through modules and classes"),
        ("tasks.kernels:Kernel", "abstract class"),
        ("tasks.kernels:MatmulKernel", "abstract class"),
        (".relative:thing", "dotted Python names"),
    ],
)
def test_non_kernel_targets_are_refused_before_anything_is_called(ref, match):
    with pytest.raises(KernelError, match=match) as err:
        get_kernel(ref, args="touch pwned", shell=True)
    assert "kernel_function" in str(err.value) or "abstract" in str(err.value) or match in str(err.value)


def test_refused_standard_library_module_is_not_imported():
    sys.modules.pop("antigravity", None)
    with pytest.raises(KernelError, match="it was not imported"):
        get_kernel("antigravity:fly")
    assert "antigravity" not in sys.modules


def test_marked_variants_work():
    from _user_kernels import marked_matmul

    k = get_kernel("_user_kernels:marked_matmul")
    assert isinstance(k, reg.MatmulKernel) and "fp32 accumulation" in k.description
    a, b = torch.randn(3, 5).bfloat16(), torch.randn(5, 2).bfloat16()
    assert torch.equal(k.matmul(a, b), marked_matmul(a, b))  # the decorated name still calls f
    f = get_kernel("_user_kernels:make_float_reference", offset=1.0)
    assert isinstance(f, Kernel) and f.params == {"offset": 1.0}


def test_kernel_function_wraps_without_modifying():
    def f(a, b):
        return a @ b

    marked = reg.kernel_function(f)
    assert isinstance(marked, reg.KernelFunction) and marked is not f and not hasattr(f, "fn")
    assert marked.__name__ == "f" and marked.__wrapped__ is f
    with pytest.raises(TypeError):
        reg.kernel_function(42)  # type: ignore[arg-type]


def test_register_refuses_unmarked_callables(scratch_names):
    from _user_kernels import marked_matmul, unmarked_matmul

    with pytest.raises(KernelError, match="marked @kernel_function"):
        register_kernel("test-unmarked", unmarked_matmul)
    register_kernel("test-marked", marked_matmul)
    scratch_names.append("test-marked")
    assert isinstance(get_kernel("test-marked"), reg.MatmulKernel)


def test_factory_must_return_a_kernel(scratch_names):
    register_kernel("test-bad-factory", reg.kernel_factory(lambda **p: 42))
    scratch_names.append("test-bad-factory")
    with pytest.raises(KernelError, match="returned int, not a tasks.kernels.Kernel"):
        get_kernel("test-bad-factory")


def test_user_kernels_switch(monkeypatch, scratch_names):
    monkeypatch.delenv(reg.USER_KERNELS_ENV, raising=False)
    assert reg.user_kernels_enabled()
    eps = [EntryPoint("test-ep-off", "_user_kernels:FloatReference", reg.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(reg.metadata, "entry_points", lambda group: eps)
    monkeypatch.setattr(reg, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(reg, "_REFUSED_ENTRY_POINTS", {})
    scratch_names.append("test-ep-off")
    with reg.user_kernels(False):
        assert os.environ[reg.USER_KERNELS_ENV] == "0"  # Ray workers inherit it
        assert not reg.user_kernels_enabled()
        with pytest.raises(KernelError, match="user kernels are turned off"):
            get_kernel("_user_kernels:FloatReference")
        with pytest.raises(KernelError, match="user kernels are turned off"):
            get_kernel("test-ep-off")
        assert get_kernel("int8-cutlass-order").name == "int8-cutlass-order"  # built-ins still work
    assert reg.USER_KERNELS_ENV not in os.environ  # restored
    assert get_kernel("test-ep-off").name == "test-ep-off"
    monkeypatch.setenv(reg.USER_KERNELS_ENV, "0")
    with pytest.raises(KernelError, match="turned off"):
        get_kernel("_user_kernels:FloatReference")
    reg.set_user_kernels(True)
    assert get_kernel("_user_kernels:FloatReference").name == "_user_kernels:FloatReference"


def test_a_kernel_name_with_a_trailing_newline_is_refused() -> None:
    from tasks.kernels.registry import KernelError, register_kernel

    with pytest.raises(KernelError, match="invalid kernel name"):
        register_kernel("x\n", lambda *a: None)
