"""The ``quantize`` kind: two activation quantizers on the same captured activations, and downstream.

One unit builds the CPU W8A8 model (``tasks.models``, its own quantizer and the experiment's GEMM
kernel), runs the prompts through it once while recording the float input of every W8A8 layer call
(:func:`tasks.quantizers.model.capture_inputs`), rounds it to ``activation_dtype`` (fp32: as the
engine hands it over; bf16/fp16: as such a model would), and then, per layer and per (reference,
candidate) pair of registry quantizers (:mod:`tasks.quantizers`), quantizes that identical input
with both:

* quantized values: how many differ, and the largest ``|q_a - q_b|`` (in int8 steps, or for FP8 in
  value and in e4m3 spacings);
* scales (one per token): how many differ and the largest distance in spacings of the scale format
  (fp16 when both sides store fp16 scales, else fp32; ``tasks.numerics.distance``);
* downstream: each side's ``(q, scale)`` through the SAME GEMM kernel and weights (the replay
  machinery: ``tasks.devices.on_device`` and ``tasks.comparison.compare``), so any output difference
  is the quantizer's alone; distances in output spacings.  INT8 pairs go through ``gemm_kernel`` with
  the engine's int8 weights (``gemm_weights`` = :data:`INT8_WEIGHTS`).  FP8 pairs go through
  ``fp8_gemm_kernel`` (default ``fp8-sequential``: fp32 accumulation with the CUTLASS epilogue, the
  epilogue of vLLM's default FP8 W8A8 kernel on H100/H200, ``CutlassFP8ScaledMMLinearKernel``) with
  the layer's weights quantized once to FP8 e4m3 per output channel
  (:func:`tasks.models.quantization.quantize_weight_fp8` of the engine's int8 weights dequantized in
  fp32, ``fl32(q * scale[n])``; ``gemm_weights`` = :data:`FP8_WEIGHTS`); the row's ``gemm_kernel``
  names the FP8 kernel then.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from tasks.kinds.base import Kind, Rows, Unit, UnitContext
from tasks.kinds.fields import (
    MAX_SEED,
    Implementation,
    Prompts,
    QuantizerRef,
    Resources,
    Strict,
    SyntheticPrompts,
    impl_payload,
    kernel_problem,
    model_and_prompt_problems,
    model_fingerprint,
    prompt_payload,
    quantizer_payload,
    quantizer_problem,
    resolve_model_and_prompts,
)

VERSION = "1"
#: The ``gemm_weights`` of a row: what weights the downstream GEMM multiplied.
INT8_WEIGHTS = "int8 per-channel (the engine's)"
FP8_WEIGHTS = "fp8_e4m3 per-channel (the engine's int8 weights dequantized in fp32, requantized)"
#: The FP8 GEMM kernel of an FP8 pair by default (module docstring).
FP8_GEMM_KERNEL = "fp8-sequential"


def as_ref(x: str | QuantizerRef) -> QuantizerRef:
    return x if isinstance(x, QuantizerRef) else QuantizerRef(quantizer=x)


class QuantizeExperiment(Strict):
    """Compare activation quantizers on the activations of a real forward pass, layer by layer, and
    replay each side through one fixed GEMM kernel."""

    kind: Literal["quantize"]
    model: str = "tiny-qwen3"
    model_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    #: The side every candidate is compared against (default: vLLM's dynamic per-token INT8).
    reference: str | QuantizerRef = "vllm-int8"
    candidates: list[str | QuantizerRef] = Field(min_length=1)
    #: The GEMM kernel both sides' operands go through (fixed: only the quantizer changes).
    gemm_kernel: str = "int8-cutlass-order"
    #: The FP8 GEMM kernel both sides' operands go through when the quantizers produce FP8 e4m3
    #: (the layer's weights quantized once to e4m3 per output channel); unused for INT8 pairs.
    fp8_gemm_kernel: str = FP8_GEMM_KERNEL
    #: The dtype the activations are rounded to before quantizing (both sides alike): ``fp32`` is what
    #: the W8A8 engine hands its quantizer; ``bf16``/``fp16`` is what a bf16/fp16 model would.
    activation_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    prompts: Prompts = Field(default_factory=SyntheticPrompts)
    resources: Resources = Field(default_factory=Resources)

    def refs(self) -> tuple[QuantizerRef, list[QuantizerRef]]:
        return as_ref(self.reference), [as_ref(c) for c in self.candidates]


def problems(base: str, exp: QuantizeExperiment) -> list[str]:
    from tasks.quantizers import get_quantizer

    ref, cands = exp.refs()
    out = [p for p in [quantizer_problem(f"{base}.reference", ref)] if p]
    a = None if out else get_quantizer(ref.quantizer, **ref.params).out_dtype
    for i, c in enumerate(cands):
        p = quantizer_problem(f"{base}.candidates[{i}]", c)
        if p:
            out.append(p)
        elif a is not None:
            b = get_quantizer(c.quantizer, **c.params).out_dtype
            if a != b:
                out.append(f"{base}.candidates[{i}]: {c.quantizer!r} produces {b} but the reference produces {a}; "
                           "compare quantizers of one output type")
        if c.name == ref.name:
            out.append(f"{base}.candidates[{i}]: named {c.name!r} like the reference; give one a distinct `label`")
    names = [c.name for c in cands]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        out.append(f"{base}.candidates: {dup} appear more than once; give each a distinct `label`")
    p = kernel_problem(f"{base}.gemm_kernel", Implementation(kernel=exp.gemm_kernel), "int8")
    if p:
        out.append(p)
    p = kernel_problem(f"{base}.fp8_gemm_kernel", Implementation(kernel=exp.fp8_gemm_kernel), "fp8_e4m3")
    if p:
        out.append(p)
    out.extend(model_and_prompt_problems(base, exp.model, exp.prompts))
    return out


def expand(experiment: str, exp: QuantizeExperiment) -> list[Unit]:
    ref, cands = exp.refs()
    params = {
        "model": exp.model,
        "model_fingerprint": model_fingerprint(exp.model),
        "model_seed": exp.model_seed,
        "reference": quantizer_payload(ref),
        "candidates": [quantizer_payload(c) for c in cands],
        "gemm_kernel": impl_payload(Implementation(kernel=exp.gemm_kernel)),
        "activation_dtype": exp.activation_dtype,
        "prompts": prompt_payload(exp.prompts),
    }
    if _is_fp8(ref):  # only FP8 units carry it: an INT8 unit's id is what it was before FP8 had a downstream
        params["fp8_gemm_kernel"] = impl_payload(Implementation(kernel=exp.fp8_gemm_kernel))
    return [KIND.unit(experiment, params, exp.resources)]


def _is_fp8(ref: QuantizerRef) -> bool:
    from tasks.quantizers import get_quantizer

    return get_quantizer(ref.quantizer, **ref.params).out_dtype == "fp8_e4m3"


def describe(p: dict[str, Any]) -> str:
    cands = ", ".join(c["name"] for c in p["candidates"])
    gemm = (p.get("fp8_gemm_kernel") or p["gemm_kernel"])["name"]
    return (f"quantize {p['model']} ({p['activation_dtype']} activations): {p['reference']['name']} vs {cands}; "
            f"GEMM {gemm}")


def compare_quantized(qa: Any, sa: Any, qb: Any, sb: Any) -> dict[str, Any]:
    """Quantized values and scales of two quantizers on one input (columns in docs/schema.md)."""
    import numpy as np
    import torch

    from tasks.numerics import distance

    if qa.dtype == torch.int8:
        diff = (qa.to(torch.int32) - qb.to(torch.int32)).abs()
        q_differing = int(diff.ne(0).sum())
        q_max_abs = float(diff.max()) if diff.numel() else 0.0
        q_max_spacing = int(q_max_abs)
    else:
        d = np.asarray(distance(qa, qb, "fp8_e4m3fn")).reshape(-1)
        q_differing = int((d != 0).sum())
        q_max_spacing = int(d.max(initial=0))
        q_max_abs = float((qa.float() - qb.float()).abs().max()) if qa.numel() else 0.0
    fmt = "fp16" if sa.dtype == torch.float16 and sb.dtype == torch.float16 else "fp32"
    dt = torch.float16 if fmt == "fp16" else torch.float32
    ds = np.asarray(distance(sa.to(dt), sb.to(dt), fmt)).reshape(-1)
    fa, fb = sa.double().reshape(-1), sb.double().reshape(-1)
    rel = ((fa - fb).abs() / torch.maximum(fa.abs(), fb.abs()).clamp_min(1e-300)) if fa.numel() else fa
    elements = int(qa.numel())
    return {
        "q_dtype": "int8" if qa.dtype == torch.int8 else "fp8_e4m3",
        "elements": elements,
        "q_differing": q_differing,
        "q_frac_differing": q_differing / elements if elements else 0.0,
        "q_max_abs_diff": q_max_abs,
        "q_max_spacing": q_max_spacing,
        "tokens": int(ds.size),
        "scales_differing": int((ds != 0).sum()),
        "scale_format": fmt,
        "scale_max_spacing": int(ds.max(initial=0)),
        "scale_max_rel_diff": float(rel.max()) if rel.numel() else 0.0,
    }


def fp8_weights(layer: Any) -> tuple[Any, Any]:
    """The layer's weights as the FP8 downstream multiplies them: the engine's int8 ``q`` ``[N, K]``
    dequantized in fp32 (``fl32(q * scale[n])``), then :func:`quantize_weight_fp8` (per output
    channel): ``(q float8_e4m3fn [N, K], scale float32 [N])``."""
    import torch

    from tasks.models.quantization import quantize_weight_fp8

    w = layer.weight.to(torch.float32) * layer.weight_scale.to(torch.float32).reshape(-1, 1)
    return quantize_weight_fp8(w)


def downstream(kernel: Any, weights: tuple[Any, Any], bias: Any, out_dtype: Any,
               qa: Any, sa: Any, qb: Any, sb: Any) -> dict[str, Any]:
    """Both sides' operands through one GEMM kernel and the same weights ``(q [N, K], scale [N])``:
    output differences (the reference side's output is the one distances are measured from)."""
    import torch

    from tasks.comparison import compare
    from tasks.devices import on_device
    from tasks.numerics import get_format

    w, ws = weights[0].t(), weights[1]
    oa, _ = on_device(kernel.device, kernel, qa, w, sa.to(torch.float32), ws, out_dtype, bias)
    ob, _ = on_device(kernel.device, kernel, qb, w, sb.to(torch.float32), ws, out_dtype, bias)
    s = compare(ob, oa, get_format(out_dtype))  # the reference side is out_b
    return {"out_elements": s["elements"], "out_differing": s["differing"], "out_frac_differing": s["frac_differing"],
            "out_max_spacing": s["max_spacing"], "out_max_spacing_significant": s["max_spacing_significant"],
            "out_max_abs_error": s["max_abs_error"], "out_bitwise_equal": s["differing"] == 0}


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """Capture every layer's input in one forward pass, then compare the quantizers on it."""
    import torch

    from tasks.kernels import get_kernel
    from tasks.models import build_model
    from tasks.prompts import prompts_from_payload
    from tasks.quantizers import get_quantizer
    from tasks.quantizers.model import capture_inputs

    gk = params["gemm_kernel"]
    model = build_model(params["model"], kernel={"kernel": gk["kernel"], "params": gk["params"]}, scales="real",
                        seed=params["model_seed"])
    prompts = prompts_from_payload(params["prompts"], int(model.config.vocab_size))
    with capture_inputs(model) as inputs:
        model.forward_tokens(prompts)
    ref = params["reference"]
    qref = get_quantizer(ref["quantizer"], **ref["params"])
    fp8 = qref.out_dtype == "fp8_e4m3"
    down = params["fp8_gemm_kernel"] if fp8 else gk
    kernel = get_kernel(down["kernel"], **down["params"])
    cands = [(c, get_quantizer(c["quantizer"], **c["params"])) for c in params["candidates"]]
    act = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[params["activation_dtype"]]
    weights: dict[str, tuple[Any, Any]] = {}  # layer name -> its downstream weights, quantized once
    rows: Rows = []
    for li in inputs:
        x = li.x.to(act)
        qa, sa = qref(x)
        if li.name not in weights:
            weights[li.name] = fp8_weights(li.layer) if fp8 else (li.layer.weight, li.layer.weight_scale)
        base = {"model": params["model"], "activation_dtype": params["activation_dtype"], "layer": li.key, "layer_index": li.index, "layer_type": li.layer_type,
                "m": int(li.x.shape[0]), "k": int(li.x.shape[1]), "n": int(li.layer.out_features),
                "reference": ref["name"], "reference_quantizer": ref["quantizer"], "gemm_kernel": down["name"],
                "gemm_weights": FP8_WEIGHTS if fp8 else INT8_WEIGHTS,
                "reference_params": json.dumps(ref["params"], sort_keys=True)}
        for c, qc in cands:
            qb, sb = qc(x)
            rows.append({**base, "candidate": c["name"], "candidate_quantizer": c["quantizer"],
                         "candidate_params": json.dumps(c["params"], sort_keys=True),
                         **compare_quantized(qa, sa, qb, sb),
                         **downstream(kernel, weights[li.name], li.layer.bias, li.layer.out_dtype, qa, sa, qb, sb)})
    return {"quantize": rows}


KIND = Kind(name="quantize", version=VERSION, spec=QuantizeExperiment, tables=("quantize",), describe=describe,
            run=run, expand=expand, problems=problems, resolve=resolve_model_and_prompts, doc=__doc__ or "")
