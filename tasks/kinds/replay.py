"""The ``replay`` kind: capture every W8A8 layer's operands in a real forward pass, replay them.

One unit builds the CPU W8A8 model (``tasks.models``) with the capture kernel, runs the prompts
through it once while recording each linear layer's exact operands (``x_q``, ``x_scale``, ``w_q``,
``w_scale``, bias) and output, saves them to one safetensors file, and then feeds each layer's
operands to both kernels of every pair:

* ``real`` scales: the operands exactly as captured;
* ``pow2`` scales: the same integer operands with both scales rounded up to powers of two (the
  paper's intervention): every multiplication by a scale is then exact, so any two correct INT8
  kernels must agree bit for bit.

Each layer also gets a ``capture`` row comparing the captured output with the capture kernel's
replay of the captured operands: it must be identical, which shows that replay measures the kernels
and nothing else. The "integer alibi" columns run each kernel with unit scales and fp32 output: the
accumulators of two correct INT8 kernels agree exactly below the no-overflow bound.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from tasks.comparison import compare
from tasks.devices import on_device
from tasks.kinds.base import Kind, Rows, Unit, UnitContext
from tasks.kinds.fields import (
    MAX_SEED,
    Implementation,
    Prompts,
    Resources,
    ScaleMode,
    Strict,
    SyntheticPrompts,
    as_impl,
    impl_payload,
    kernel_problem,
    model_and_prompt_problems,
    model_fingerprint,
    needs_gpu,
    prompt_payload,
    resolve_model_and_prompts,
)

if TYPE_CHECKING:
    import torch

VERSION = "1"

#: fp32 holds every integer up to 2**24 exactly: below it the unit-scale output *is* the accumulator.
FP32_EXACT_INT = 2**24


class ReplayExperiment(Strict):
    """Capture every W8A8 layer's operands in a forward pass, then replay them through kernel pairs."""

    kind: Literal["replay"]
    model: str = "tiny-qwen3"
    model_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    #: "cpu": the CPU W8A8 engine captures with a registry kernel; "vllm": vLLM captures with a
    #: kernel family (cutlass-int8 / triton-int8) on a GPU, and pairs name GPU registry kernels.
    engine: Literal["cpu", "vllm"] = "cpu"
    capture_kernel: str = "int8-cutlass-order"
    pairs: list[list[str | Implementation]] = Field(min_length=1)
    scale_modes: list[ScaleMode] = Field(default_factory=lambda: list[ScaleMode](["real", "pow2"]), min_length=1)
    prompts: Prompts = Field(default_factory=SyntheticPrompts)
    out_dtype: Literal["bf16", "fp16"] = "bf16"
    resources: Resources = Field(default_factory=Resources)

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: list[list[Any]]) -> list[list[Any]]:
        for i, pair in enumerate(v):
            if len(pair) != 2:
                raise ValueError(f"pair {i} must name exactly two kernels, got {len(pair)}")
        return v

    def impl_pairs(self) -> list[tuple[Implementation, Implementation]]:
        return [(as_impl(a), as_impl(b)) for a, b in self.pairs]


def problems(base: str, exp: ReplayExperiment) -> list[str]:
    out = []
    if exp.engine == "vllm":
        from tasks.models.vllm_selection import FAMILIES

        if exp.capture_kernel not in FAMILIES and exp.capture_kernel not in ("cutlass", "triton"):
            out.append(f"{base}.capture_kernel: {exp.capture_kernel!r} is not a vLLM kernel family; allowed: {', '.join(FAMILIES)}")
    else:
        p = kernel_problem(f"{base}.capture_kernel", Implementation(kernel=exp.capture_kernel), "int8")
        if p:
            out.append(p)
    for i, (a, b) in enumerate(exp.impl_pairs()):
        for j, impl in enumerate((a, b)):
            p = kernel_problem(f"{base}.pairs[{i}][{j}]", impl, "int8")
            if p:
                out.append(p)
        if a.name == b.name:
            out.append(f"{base}.pairs[{i}]: both sides are {a.name!r}; give one a distinct `label`")
    if exp.engine == "cpu":
        out.extend(model_and_prompt_problems(base, exp.model, exp.prompts))
    return out


def expand(experiment: str, exp: ReplayExperiment) -> list[Unit]:
    params = {
        "model": exp.model,
        "model_fingerprint": model_fingerprint(exp.model),
        "model_seed": exp.model_seed,
        "engine": exp.engine,
        "capture_kernel": (impl_payload(Implementation(kernel=exp.capture_kernel)) if exp.engine == "cpu" else
                           {"name": exp.capture_kernel, "kernel": exp.capture_kernel, "params": {}, "version": "vllm"}),
        "pairs": [[impl_payload(a), impl_payload(b)] for a, b in exp.impl_pairs()],
        "scale_modes": list(exp.scale_modes),
        "prompts": prompt_payload(exp.prompts),
        "out_dtype": exp.out_dtype,
    }
    pair_impls = [i for pair in exp.impl_pairs() for i in pair]
    resources = exp.resources.with_gpu(exp.engine == "vllm" or needs_gpu(pair_impls))
    return [KIND.unit(experiment, params, resources, needs=("vllm",) if exp.engine == "vllm" else ())]


def describe(p: dict[str, Any]) -> str:
    pairs = ", ".join(f"{a['name']}~{b['name']}" for a, b in p["pairs"])
    return f"replay {p['model']} (captured with {p['capture_kernel']['name']}): {pairs}; scales {'/'.join(p['scale_modes'])}"


def _scales(layer: Any, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    from tasks.models.quantization import pow2_up

    sa, sb = layer.x_scale.float().reshape(-1, 1), layer.w_scale.float().reshape(-1)
    if mode == "pow2":
        return pow2_up(sa), pow2_up(sb)
    return sa, sb


def accumulator_rows(kernels: dict[str, Any], layer: Any) -> dict[str, Any]:
    """Each kernel's int32 accumulator, read through unit scales vs the exact one.

    fp32 output where the kernel writes it (CPU kernels); vLLM's ops write bf16/fp16 only, so there
    the accumulators are read as fp16 outputs, exact up to 2048 — ``accumulator_check`` says which.
    """
    import torch

    a, b = layer.x_q, layer.w_q.t()
    m, n = a.shape[0], b.shape[1]
    exact = a.to(torch.float64) @ b.to(torch.float64)
    peak = int(exact.abs().max().item()) if exact.numel() else 0
    ones_a, ones_b = torch.ones(m, 1), torch.ones(n)
    gpu = any(k.device == "cuda" for k in kernels.values())
    out_dtype, limit = (torch.float16, 2048) if gpu else (torch.float32, FP32_EXACT_INT)
    accs = [on_device(k.device, k, a, b, ones_a, ones_b, out_dtype, None)[0] for k in kernels.values()]
    equal = all(torch.equal(accs[0], x) for x in accs[1:])
    exact_ok = all(torch.equal(x.double(), exact) for x in accs) if peak <= limit else None
    return {
        "accumulators_equal": equal,
        "accumulators_exact": exact_ok,
        "accumulator_check": "exact" if peak <= limit else ("fp16-rounded" if gpu else "fp32-rounded"),
        "max_abs_accumulator": peak,
    }


def replay_layers(layers: list[Any], capture_kernel: dict[str, Any], pairs: list[list[dict[str, Any]]],
                  scale_modes: list[str], out_dtype: str) -> list[dict[str, Any]]:
    """Rows of the ``replay`` table for captured layers (see docs/schema.md)."""
    from tasks.kernels import get_kernel
    from tasks.kernels.accumulator import shared_accumulators
    from tasks.numerics import get_format

    fmt = get_format(out_dtype)
    dtype = fmt.torch_dtype
    cap = get_kernel(capture_kernel["kernel"], **capture_kernel["params"])
    rows: list[dict[str, Any]] = []
    for layer in layers:
        a, b = layer.x_q, layer.w_q.t()
        base = {"layer": _layer_key(layer.name, getattr(layer, "call", 0)), "layer_index": layer.index,
                "layer_type": layer.layer_type,
                "m": a.shape[0], "n": b.shape[1], "k": a.shape[1]}
        # Replaying through the kernel the model ran with must reproduce the captured output.
        cap_fmt = get_format(layer.output.dtype)
        again, _ = on_device(cap.device, cap, a, b, layer.x_scale, layer.w_scale, layer.output.dtype, layer.bias)
        stats = compare(layer.output.reshape(again.shape), again, cap_fmt)
        rows.append({**base, "scale_mode": "real", "comparison": "capture", "impl_a": "captured-output",
                     "impl_b": capture_kernel["name"], **stats, "bitwise_equal": stats["differing"] == 0,
                     "accumulators_equal": None, "accumulators_exact": None, "accumulator_check": None,
                     "max_abs_accumulator": None})
        bias = layer.bias.to(dtype) if layer.bias is not None else None
        for pa, pb in pairs:
            ka = get_kernel(pa["kernel"], **pa["params"])
            kb = get_kernel(pb["kernel"], **pb["params"])
            # each kernel's accumulator computed on its own: the check compares them
            alibi = accumulator_rows({pa["name"]: ka, pb["name"]: kb}, layer)
            # then one exact accumulator per layer for the built-in INT8 kernels (tasks/kernels/accumulator.py)
            with shared_accumulators():
                for mode in scale_modes:
                    sa, sb = _scales(layer, mode)
                    oa, _ = on_device(ka.device, ka, a, b, sa, sb, dtype, bias)
                    ob, _ = on_device(kb.device, kb, a, b, sa, sb, dtype, bias)
                    stats = compare(oa, ob, fmt)
                    rows.append({**base, "scale_mode": mode, "comparison": "pair", "impl_a": pa["name"],
                                 "impl_b": pb["name"], **stats, "bitwise_equal": stats["differing"] == 0, **alibi})
    return rows


MANIFEST_KEYS = ("layer_index", "layer_type", "m", "n", "k", "x_dtype", "out_dtype", "x_scale_layout",
                 "w_scale_layout", "has_bias")


def _layer_key(name: str, call: int) -> str:
    """A layer called more than once in a capture (decode steps) gets ``@call`` appended, as in the file."""
    return f"{name}@{call}" if call else name


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """Capture, save, reload and replay; rows for the ``replay`` and ``captures`` tables."""
    from tasks.models import build_model, capture_manifest, load_capture, save_capture
    from tasks.prompts import prompts_from_payload

    ck = params["capture_kernel"]
    if params.get("engine", "cpu") == "vllm":
        from tasks.models.vllm_engine import VllmEngine

        prompts = prompts_from_payload(params["prompts"], 1000)
        engine = VllmEngine(params["model"], kernel=ck["kernel"], seed=params["model_seed"],
                            max_model_len=max(len(p) for p in prompts) + 2)
        engine.reset_kernel_calls()
        with engine.capture(split=True) as cap:
            engine.score(prompts, top_k=2)
        engine.require_evidence()
        calls = engine.kernel_calls()
        # Replaying the captured output: the registry kernel the layers ran (vllm-cutlass / vllm-triton).
        ck = {"name": cap.layers[0].kernel, "kernel": cap.layers[0].kernel, "params": {}}
    else:
        model = build_model(params["model"], kernel={"kernel": ck["kernel"], "params": ck["params"]}, scales="real",
                            seed=params["model_seed"])
        prompts = prompts_from_payload(params["prompts"], int(model.config.vocab_size))
        model.reset_kernel_calls()
        with model.capture() as cap:
            model.forward_tokens(prompts)
        calls = model.kernel_calls()
    rel: str | None = None
    if context is not None:
        import tempfile

        with tempfile.TemporaryDirectory() as td:
            local = Path(td) / "capture.safetensors"
            save_capture(cap, local)
            layers = load_capture(local)  # replay what was saved, so the file is the evidence
            rel = context.put_artifact("capture.safetensors", local.read_bytes())
    else:
        layers = list(cap.layers)
    manifest = [
        {**{k: row[k] for k in MANIFEST_KEYS}, "layer": _layer_key(row["layer"], row["call"]), "model": params["model"],
         "capture_kernel": row["kernel"], "kernel_calls": sum(calls.get(row["layer"], {}).values()), "file": rel}
        for row in capture_manifest(cap)
    ]
    rows = replay_layers(layers, ck, params["pairs"], params["scale_modes"], params["out_dtype"])
    return {"replay": [{**r, "model": params["model"]} for r in rows], "captures": manifest}


KIND = Kind(name="replay", version=VERSION, spec=ReplayExperiment, tables=("replay", "captures"),
            describe=describe, run=run, expand=expand, problems=problems, resolve=resolve_model_and_prompts,
            doc=__doc__ or "")
