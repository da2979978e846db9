"""``batch_invariance`` at the kernel level, attention kernels (table ``batch_invariance_attention``):
one probe batch element's causal attention alone and among B elements (the package docstring,
"Attention kernels").
"""

from __future__ import annotations

import itertools
from typing import Any

from tasks.comparison import compare
from tasks.devices import on_device
from tasks.kinds.base import Rows
from tasks.kinds.batch_invariance.spec import ATTENTION_DTYPES, BatchInvarianceExperiment, probe_row
from tasks.kinds.fields import Resources, axis_values, memory_problem


def problems(base: str, exp: BatchInvarianceExperiment, max_batch: int) -> list[str]:
    """Each attention kernel must run here, on its own (not only inside an engine), and the largest
    batch of q, k, v (three float64 draws of ``[B, heads, seq_len, head_dim]``) must fit."""
    from tasks.attention import AttentionError, get_attention

    out = []
    for i, name in enumerate(exp.attention_kernels):
        field = f"{base}.attention_kernels[{i}]"
        try:
            kernel = get_attention(name)
        except AttentionError as exc:
            out.append(f"{field}: {exc}")
            continue
        ok, why = kernel.available()
        if not ok:
            out.append(f"{field}: attention kernel {name!r} is not available here: {why}")
    if exp.attention_kernels:
        size = 3 * 8 * max_batch * exp.heads * exp.seq_len * exp.head_dim
        p = memory_problem(f"{base}.m/heads/seq_len/head_dim",
                           f"B={max_batch} heads={exp.heads} seq_len={exp.seq_len} head_dim={exp.head_dim}",
                           2 * size, exp.resources)
        out += [p] if p else []
    return out


def expand(exp: BatchInvarianceExperiment) -> list[tuple[dict[str, Any], Resources]]:
    """One unit per attention kernel and seed: its parameters and resources."""
    from tasks.attention import get_attention
    from tasks.attention.fields import attention_payload

    units: list[tuple[dict[str, Any], Resources]] = []
    # Their own parameters: the GEMM units keep theirs, and so their ids.
    for name, seed in itertools.product(exp.attention_kernels, exp.seed_values()):
        params = {"level": "kernel", "attention": attention_payload(name), "dtype": exp.attention_dtype,
                  "m": axis_values(exp.m), "positions": exp.attention_positions(), "heads": exp.heads,
                  "seq_len": exp.seq_len, "head_dim": exp.head_dim, "seed": seed,
                  "tolerance_spacings": exp.tolerance_spacings}
        units.append((params, exp.resources.with_gpu(get_attention(name).device == "cuda")))
    return units


def describe(p: dict[str, Any]) -> str:
    ms = p["m"]
    return (f"batch invariance of attention {p['attention']['name']} ({p['dtype']}, heads={p['heads']} "
            f"seq_len={p['seq_len']} head_dim={p['head_dim']}, causal, seed {p['seed']}): probe element at "
            f"{'/'.join(p['positions'])} of B={ms[0]}..{ms[-1]} ({len(ms)} sizes)")


def run_attention(params: dict[str, Any]) -> dict[str, Rows]:
    """One attention kernel and seed: the probe element's causal attention alone (B = 1), then at each
    position of each batch of B elements, its neighbours other random q, k, v.

    Every element's q, k, v are drawn independently (standard normal in float64, rounded once to the
    dtype), so the probe's operands are the same tensors whatever the batch; the output rows and the
    logsumexp of the probe are compared with those of the probe alone, bit for bit and in spacings
    (output: the dtype's; logsumexp: fp32)."""
    import numpy as np
    import torch

    from tasks.attention import get_attention
    from tasks.numerics import distance, get_format
    from tasks.seeds import stable_seed

    att = params["attention"]
    kernel = get_attention(att["name"])
    fmt = get_format(ATTENTION_DTYPES[params["dtype"]])
    ms = list(params["m"])
    g = torch.Generator().manual_seed(stable_seed("batch_invariance_attention", params["seed"], params["heads"],
                                                  params["seq_len"], params["head_dim"]))
    shape = (max(ms), params["heads"], params["seq_len"], params["head_dim"])
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64).to(fmt.torch_dtype) for _ in range(3))

    def call(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        (out, lse), seconds = on_device(kernel.device, kernel, *(x[idx].contiguous() for x in (q, k, v)),
                                        is_causal=True)
        return out, lse, seconds

    ref, ref_lse, ref_seconds = call(torch.zeros(1, dtype=torch.long))
    base = {"kernel": att["name"], "kernel_version": att["version"], "device": kernel.device, "dtype": params["dtype"],
            "heads": params["heads"], "seq_len": params["seq_len"], "head_dim": params["head_dim"], "causal": True,
            "seed": params["seed"], "tolerance_spacings": params["tolerance_spacings"],
            "seconds_reference": ref_seconds}
    rows = []
    for m in ms:
        for position in params["positions"]:
            r = probe_row(m, position, params["seed"])
            order = torch.cat([torch.arange(1, r + 1), torch.zeros(1, dtype=torch.long), torch.arange(r + 1, m)])
            out, lse, seconds = call(order)
            stats = compare(out[r: r + 1].reshape(-1, params["head_dim"]), ref.reshape(-1, params["head_dim"]), fmt)
            d = np.asarray(distance(lse[r: r + 1].contiguous(), ref_lse.contiguous(), "fp32")).reshape(-1)
            lse_differing = int((d != 0).sum())
            rows.append({**base, "batch": m, "position": position, "row_index": r, **stats,
                         "lse_differing": lse_differing, "lse_max_spacing": int(d.max(initial=0)),
                         "bitwise_equal": stats["differing"] == 0 and lse_differing == 0, "seconds": seconds})
    return {"batch_invariance_attention": rows}
