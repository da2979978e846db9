"""The ``replay`` task: capture every W8A8 layer's operands in a real forward pass, replay them.

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
from typing import Any

import torch

from tasks.kdepth import OUT_DTYPES, compare

#: fp32 holds every integer up to 2**24 exactly: below it the unit-scale output *is* the accumulator.
FP32_EXACT_INT = 2**24


def pow2_up(s: torch.Tensor) -> torch.Tensor:
    """Scales rounded up to powers of two (so quantized values never saturate)."""
    return torch.exp2(torch.ceil(torch.log2(s.double()))).float()


def _scales(layer: Any, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    sa, sb = layer.x_scale.float().reshape(-1, 1), layer.w_scale.float().reshape(-1)
    if mode == "pow2":
        return pow2_up(sa), pow2_up(sb)
    return sa, sb


def call(kernel: Any, a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, dtype: torch.dtype,
         bias: torch.Tensor | None) -> torch.Tensor:
    """Run a kernel on its device (GPU kernels take their operands there) and return a CPU tensor."""
    if kernel.device == "cuda":
        a, b, sa, sb = a.cuda(), b.cuda(), sa.cuda(), sb.cuda()
        bias = None if bias is None else bias.cuda()
    return kernel(a, b, sa, sb, dtype, bias).cpu()


def accumulator_rows(kernels: dict[str, Any], layer: Any) -> dict[str, Any]:
    """Each kernel's int32 accumulator, read through unit scales vs the exact one.

    fp32 output where the kernel writes it (CPU kernels); vLLM's ops write bf16/fp16 only, so there
    the accumulators are read as fp16 outputs, exact up to 2048 — ``accumulator_check`` says which.
    """
    a, b = layer.x_q, layer.w_q.t()
    m, n = a.shape[0], b.shape[1]
    exact = a.to(torch.float64) @ b.to(torch.float64)
    peak = int(exact.abs().max().item()) if exact.numel() else 0
    ones_a, ones_b = torch.ones(m, 1), torch.ones(n)
    gpu = any(k.device == "cuda" for k in kernels.values())
    out_dtype, limit = (torch.float16, 2048) if gpu else (torch.float32, FP32_EXACT_INT)
    accs = [call(k, a, b, ones_a, ones_b, out_dtype, None) for k in kernels.values()]
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
    from tasks.numerics import get_format

    dtype = OUT_DTYPES[out_dtype]
    fmt = get_format(dtype)
    cap = get_kernel(capture_kernel["kernel"], **capture_kernel["params"])
    rows: list[dict[str, Any]] = []
    for layer in layers:
        a, b = layer.x_q, layer.w_q.t()
        base = {"layer": _layer_key(layer.name, getattr(layer, "call", 0)), "layer_index": layer.index,
                "layer_type": layer.layer_type,
                "m": a.shape[0], "n": b.shape[1], "k": a.shape[1]}
        # Replaying through the kernel the model ran with must reproduce the captured output.
        cap_fmt = get_format(layer.output.dtype)
        again = call(cap, a, b, layer.x_scale, layer.w_scale, layer.output.dtype, layer.bias)
        stats = compare(layer.output.reshape(again.shape), again, cap_fmt)
        rows.append({**base, "scale_mode": "real", "comparison": "capture", "impl_a": "captured-output",
                     "impl_b": capture_kernel["name"], **stats, "bitwise_equal": stats["differing"] == 0,
                     "accumulators_equal": None, "accumulators_exact": None, "accumulator_check": None,
                     "max_abs_accumulator": None})
        bias = layer.bias.to(dtype) if layer.bias is not None else None
        for pa, pb in pairs:
            ka = get_kernel(pa["kernel"], **pa["params"])
            kb = get_kernel(pb["kernel"], **pb["params"])
            alibi = accumulator_rows({pa["name"]: ka, pb["name"]: kb}, layer)
            for mode in scale_modes:
                sa, sb = _scales(layer, mode)
                oa = call(ka, a, b, sa, sb, dtype, bias)
                ob = call(kb, a, b, sa, sb, dtype, bias)
                stats = compare(oa, ob, fmt)
                rows.append({**base, "scale_mode": mode, "comparison": "pair", "impl_a": pa["name"],
                             "impl_b": pb["name"], **stats, "bitwise_equal": stats["differing"] == 0, **alibi})
    return rows


MANIFEST_KEYS = ("layer_index", "layer_type", "m", "n", "k", "x_dtype", "out_dtype", "x_scale_layout",
                 "w_scale_layout", "has_bias")


def _layer_key(name: str, call: int) -> str:
    """A layer called more than once in a capture (decode steps) gets ``@call`` appended, as in the file."""
    return f"{name}@{call}" if call else name


def run(params: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
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
    ctx = context or {}
    if ctx.get("results"):
        import tempfile

        from storage.store import open_store

        rel = f"_artifacts/sweep={ctx['sweep']}/{ctx['unit_id']}/capture.safetensors"
        with tempfile.TemporaryDirectory() as td:
            local = Path(td) / "capture.safetensors"
            save_capture(cap, local)
            layers = load_capture(local)  # replay what was saved, so the file is the evidence
            open_store(ctx["results"]).put_bytes(rel, local.read_bytes())
    else:
        layers, rel = list(cap.layers), None
    manifest = [
        {**{k: row[k] for k in MANIFEST_KEYS}, "layer": _layer_key(row["layer"], row["call"]), "model": params["model"],
         "capture_kernel": row["kernel"], "kernel_calls": sum(calls.get(row["layer"], {}).values()), "file": rel}
        for row in capture_manifest(cap)
    ]
    rows = replay_layers(layers, ck, params["pairs"], params["scale_modes"], params["out_dtype"])
    return {"replay": [{**r, "model": params["model"]} for r in rows], "captures": manifest}
