"""The CPU W8A8 engine: :func:`build_model` and :class:`W8A8Model`.

A ``transformers`` causal LM (Qwen3 architecture for ``tiny-qwen3``; any checkpoint whose decoder
layers have ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj``) in which those seven
linears of every decoder layer are :class:`~tasks.models.W8A8Linear` (int8 weights, per-token
int8 activations, the GEMM through a registry kernel).  Embeddings, RMSNorms, rotary embeddings, SiLU
and residual adds run in fp32; attention and ``lm_head`` run in float64 and are rounded once to fp32
(:mod:`tasks.models.invariance` says why: prefill, decode and padded runs then agree bit for bit).

Dtype between layers: **fp32**.  Each W8A8 GEMM writes its output in ``out_dtype`` (bf16 by
default, as a bf16 vLLM model's linears do) and the engine up-casts it exactly to fp32, so the
kernel's epilogue rounding is the one and only rounding a W8A8 layer adds; the non-linear parts
keep fp32 so that they add as little noise of their own as possible.  (A vLLM bf16 model also
rounds its residual stream and attention to bf16; the engine does not model that.)

Batching: prompts of unequal length are **left-padded** with the pad token (``pad_token_id``, 0
if unset) under an attention mask; position ids count real tokens only.  Padded rows still flow
through the W8A8 layers (and appear in captures) but are masked out of attention.

Determinism: every entry point runs under ``torch.inference_mode()`` with ``torch`` set to
``threads`` intra-op threads (default 1, restored afterwards), with no sampling: greedy argmax
with ties to the lower token id.  The same model, prompts and kernel give the same tokens in one
process and across processes with the same thread count.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .capture import Capture
from .checkpoint import (
    SHIPPED_MODELS,
    Checkpoint,
    _build_float,
    read_checkpoint,
    shipped_model_dir,
    tiny_qwen3_float,
)
from .invariance import kv_cache
from .linear import OUT_DTYPES, PROJECTIONS, W8A8Linear, resolve_kernel
from .predictions import GenerationResult, ScoreResult, predict, predict_arrays, target_values
from .quantization import check_scale_mode, quantize_weight, requantize_weight_pow2

__all__ = ["build_model", "W8A8Model", "TINY_MODEL"]

TINY_MODEL = "tiny-qwen3"


def _decoder_layers(hf: Any) -> Any:
    layers = getattr(getattr(hf, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(hf).__name__} has no model.layers; the engine needs a decoder-only LM")
    return layers


def _install(hf: Any, make: Any) -> None:
    """Replace every decoder linear with ``make(index, proj_path, name, float_linear)``."""
    for i, layer in enumerate(_decoder_layers(hf)):
        for path in PROJECTIONS:
            parent_path, attr = path.rsplit(".", 1)
            try:
                parent = layer.get_submodule(parent_path)
                old = getattr(parent, attr)
            except AttributeError as exc:
                raise ValueError(
                    f"decoder layer {i} has no {path}; the engine needs "
                    f"{', '.join(PROJECTIONS)} in every decoder layer"
                ) from exc
            setattr(parent, attr, make(i, path, f"layers.{i}.{path}", old))


class W8A8Model:
    """A causal LM with W8A8 decoder linears (module docstring).  Build with :func:`build_model`.

    Attributes: ``hf`` (the transformers model), ``config``, ``model`` (name or path given),
    ``source`` ("seeded", "float-checkpoint" or "compressed-tensors"), ``scales``, ``seed``,
    ``out_dtype`` (torch dtype), ``threads``, ``notes`` (what loading decided).
    """

    def __init__(
        self,
        hf: Any,
        *,
        model: str,
        source: str,
        scales: str,
        seed: int,
        out_dtype: torch.dtype,
        threads: int | None,
        reductions: str = "fp64",
        notes: list[str] | None = None,
    ) -> None:
        self.hf = hf.eval()
        self.config = hf.config
        self.model = model
        self.source = source
        self.scales = scales
        self.seed = seed
        self.out_dtype = out_dtype
        self.threads = threads
        self.reductions = reductions
        self.notes = list(notes or [])
        self._linears: dict[str, W8A8Linear] = {
            m.name: m for m in hf.modules() if isinstance(m, W8A8Linear)
        }
        self._capturing = False
        self._weights_sha256: str | None = None

    # -- layers and kernels ---------------------------------------------------------------------
    def linears(self) -> dict[str, W8A8Linear]:
        """Every W8A8 layer by name (``layers.<i>.<self_attn|mlp>.<proj>``), in forward order."""
        return dict(self._linears)

    @property
    def kernel(self) -> Any:
        """The kernel of the first layer (all layers share it unless :meth:`set_kernel` split them)."""
        return next(iter(self._linears.values())).kernel

    def set_kernel(self, kernel: Any, layers: Iterable[str] | None = None) -> None:
        """Run ``layers`` (names; default all) through ``kernel`` (name, dict or Kernel) from now on."""
        k = resolve_kernel(kernel)
        names = list(self._linears) if layers is None else list(layers)
        unknown = [n for n in names if n not in self._linears]
        if unknown:
            raise ValueError(f"unknown layer(s) {unknown}; layers are named like {next(iter(self._linears))!r}")
        for n in names:
            self._linears[n].kernel = k

    def kernel_calls(self) -> dict[str, dict[str, int]]:
        """Per layer, how many times each kernel actually ran (counted at call time)."""
        return {name: dict(lin.calls) for name, lin in self._linears.items()}

    def reset_kernel_calls(self) -> None:
        for lin in self._linears.values():
            lin.calls.clear()

    # -- identity -------------------------------------------------------------------------------
    def weights_sha256(self) -> str:
        """sha256 over every parameter and buffer (name, dtype, shape, bytes), sorted by name.

        Computed once and cached: the engine never changes weights after building.
        """
        if self._weights_sha256 is not None:
            return self._weights_sha256
        h = hashlib.sha256()
        for name, t in sorted(self.hf.state_dict().items()):
            t = t.detach().contiguous()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        self._weights_sha256 = h.hexdigest()
        return self._weights_sha256

    def identity(self) -> dict[str, Any]:
        """Provenance: model, source, config, kernel(s), scales, seed, dtypes, threads, weight hash."""
        import transformers

        cfg = {k: v for k, v in self.config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
        cfg_json = json.dumps(cfg, sort_keys=True, default=str)
        kernels = sorted({json.dumps(lin.kernel.identity, sort_keys=True, default=str) for lin in self._linears.values()})
        return {
            "model": self.model,
            "source": self.source,
            "model_type": self.config.model_type,
            "num_layers": len(_decoder_layers(self.hf)),
            "w8a8_layers": len(self._linears),
            "config_sha256": hashlib.sha256(cfg_json.encode()).hexdigest(),
            "kernel": self.kernel.name,
            "kernels": [json.loads(k) for k in kernels],
            "scales": self.scales,
            "seed": self.seed,
            "out_dtype": str(self.out_dtype).removeprefix("torch."),
            "activation_dtype": "float32",
            "reductions": self.reductions,
            "threads": self.threads,
            "weights_sha256": self.weights_sha256(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }

    # -- running --------------------------------------------------------------------------------
    @contextmanager
    def _session(self) -> Iterator[None]:
        prev = torch.get_num_threads()
        change = self.threads is not None and prev != self.threads
        if change:
            torch.set_num_threads(int(self.threads))  # type: ignore[arg-type]
        try:
            with torch.inference_mode():
                yield
        finally:
            if change:
                torch.set_num_threads(prev)

    def _check(self, seqs: list[list[int]], what: str) -> list[list[int]]:
        vocab = int(self.config.vocab_size)
        if not isinstance(seqs, list | tuple) or not seqs:
            raise ValueError(f"{what} must be a non-empty list of token-id lists")
        out = []
        for i, s in enumerate(seqs):
            toks = [int(t) for t in s]
            if not toks:
                raise ValueError(f"{what}[{i}] is empty")
            bad = [t for t in toks if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"{what}[{i}] has token ids outside [0, {vocab}): {bad[:5]}")
            out.append(toks)
        return out

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pad = self.config.pad_token_id if self.config.pad_token_id is not None else 0
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), int(pad), dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[b, width - len(p):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids, mask, positions

    def forward_tokens(self, prompts: list[list[int]]) -> torch.Tensor:
        """One forward pass over the (left-padded) batch: fp32 logits ``[B, T, V]``, T the longest prompt."""
        prompts = self._check(prompts, "prompts")
        ids, mask, positions = self._left_pad(prompts)
        with self._session():
            out = self.hf(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
            logits: torch.Tensor = out.logits.to(torch.float32).clone()
            return logits

    def generate(self, prompts: list[list[int]], max_new_tokens: int, top_k: int = 5) -> GenerationResult:
        """Greedy generation of ``max_new_tokens`` tokens per prompt, one batch, KV cache.

        Prefill runs the left-padded prompts in one pass; each later step runs one token per
        sequence (M = batch size in every W8A8 layer).  EOS does not stop generation.
        """
        prompts = self._check(prompts, "prompts")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        ids, mask, positions = self._left_pad(prompts)
        batch = len(prompts)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        topk_ids: list[list[list[int]]] = [[] for _ in range(batch)]
        topk_logits: list[list[list[float]]] = [[] for _ in range(batch)]
        margins: list[list[float]] = [[] for _ in range(batch)]
        with self._session():
            # reductions="fp64": a float64 KV cache appended step by step (tasks.models.invariance).
            cache = kv_cache(self.config, capacity=int(ids.shape[1]) + max_new_tokens)
            out = self.hf(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          past_key_values=cache, logits_to_keep=1)
            for step in range(max_new_tokens):
                am, tk, tl, mg = predict(out.logits[:, -1, :], top_k)
                for b in range(batch):
                    tokens[b].append(am[b])
                    topk_ids[b].append(tk[b])
                    topk_logits[b].append(tl[b])
                    margins[b].append(mg[b])
                if step == max_new_tokens - 1:
                    break
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
                positions = positions[:, -1:] + 1
                nxt = torch.tensor(am, dtype=torch.long).unsqueeze(1)
                out = self.hf(
                    input_ids=nxt, attention_mask=mask, position_ids=positions,
                    past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1,
                )
        return GenerationResult(prompts, tokens, topk_ids, topk_logits, margins,
                                info={"kernel": self.kernel.name, "scales": self.scales, "padding": "left"})

    def score(self, sequences: list[list[int]], top_k: int = 5) -> ScoreResult:
        """Teacher-forced scores: one unpadded forward pass per sequence, every position scored
        (:class:`~tasks.models.ScoreResult`)."""
        sequences = self._check(sequences, "sequences")
        res = ScoreResult(sequences, info={"kernel": self.kernel.name, "scales": self.scales})
        with self._session():
            for seq in sequences:
                ids = torch.tensor([seq], dtype=torch.long)
                logits = self.hf(input_ids=ids, use_cache=False).logits[0].to(torch.float32)
                am, tk, tl, mg = predict_arrays(logits, top_k)
                targets = np.append(ids[0, 1:].numpy(), -1)  # the next token; -1 after the last
                res.append(am, tk, tl, mg, targets, target_values(logits, targets))
        return res

    @contextmanager
    def capture(self) -> Iterator[Capture]:
        """Record every W8A8 layer call inside the block (:mod:`tasks.models.capture`)."""
        if self._capturing:
            raise RuntimeError("model.capture() blocks cannot be nested")
        cap = Capture(meta=self.identity())
        self._capturing = True
        for lin in self._linears.values():
            lin.recorder = cap.record
        try:
            yield cap
        finally:
            for lin in self._linears.values():
                lin.recorder = None
            self._capturing = False

    def __repr__(self) -> str:
        return (
            f"<W8A8Model {self.model} ({self.source}): {len(self._linears)} W8A8 layers, "
            f"kernel={self.kernel.name}, scales={self.scales}, out_dtype={self.out_dtype}>"
        )


def _from_checkpoint(ck: Checkpoint, make: Any, scales: str, reductions: str) -> tuple[Any, list[str]]:
    """Build the float model for ``ck``, load its non-linear tensors, install W8A8 linears."""
    hf = _build_float(ck.config, reductions)
    notes: list[str] = []
    consumed: set[str] = set()
    prefixes = tuple(f"model.layers.{i}.{p}." for i in range(len(_decoder_layers(hf))) for p in PROJECTIONS)
    tied = bool(getattr(ck.config, "tie_word_embeddings", False))
    state = {}
    for key, t in hf.state_dict().items():
        if key.startswith(prefixes):
            continue
        if key not in ck.tensors:
            if key == "lm_head.weight" and tied:
                continue
            raise ValueError(f"{ck.path}: tensor {key!r} is missing from the checkpoint")
        src = ck.tensors[key]
        if tuple(src.shape) != tuple(t.shape):
            raise ValueError(f"{ck.path}: tensor {key!r} has shape {tuple(src.shape)}, the config needs {tuple(t.shape)}")
        state[key] = src.to(torch.float32)
        consumed.add(key)
    hf.load_state_dict(state, strict=False)
    if tied:
        hf.tie_weights()

    def weights(i: int, path: str, old: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        pre = f"model.layers.{i}.{path}"
        w = ck.tensors.get(f"{pre}.weight")
        if w is None:
            raise ValueError(f"{ck.path}: tensor {pre}.weight is missing")
        n, k = int(old.weight.shape[0]), int(old.weight.shape[1])
        if tuple(w.shape) != (n, k):
            raise ValueError(f"{ck.path}: {pre}.weight has shape {tuple(w.shape)}, the config needs {(n, k)}")
        consumed.add(f"{pre}.weight")
        if f"{pre}.input_scale" in ck.tensors:
            raise ValueError(f"{ck.path}: {pre}.input_scale: static activation scales are not supported (dynamic per-token only)")
        zp = ck.tensors.get(f"{pre}.weight_zero_point")
        if zp is not None:
            if bool((zp != 0).any()):
                raise ValueError(f"{ck.path}: {pre}.weight_zero_point is non-zero; only symmetric weights are supported")
            consumed.add(f"{pre}.weight_zero_point")
        if w.dtype == torch.int8:
            if not ck.quantized:
                raise ValueError(f"{ck.path}: {pre}.weight is int8 but config.json has no quantization_config")
            s = ck.tensors.get(f"{pre}.weight_scale")
            if s is None:
                raise ValueError(f"{ck.path}: {pre}.weight is int8 but {pre}.weight_scale is missing")
            consumed.add(f"{pre}.weight_scale")
            s = s.to(torch.float32).reshape(-1)
            if s.numel() == 1:
                s = s.expand(n).contiguous()
            if s.numel() != n:
                raise ValueError(f"{ck.path}: {pre}.weight_scale has {s.numel()} elements; allowed 1 or N={n}")
            q = w
            if scales == "pow2":
                q, s = requantize_weight_pow2(q, s)
        elif w.is_floating_point():
            q, s = quantize_weight(w, scales)
        else:
            raise ValueError(f"{ck.path}: {pre}.weight has dtype {w.dtype}; allowed int8 or a float dtype")
        b = ck.tensors.get(f"{pre}.bias")
        if b is not None:
            consumed.add(f"{pre}.bias")
        elif old.bias is not None:
            raise ValueError(f"{ck.path}: tensor {pre}.bias is missing (the config has linear biases)")
        return q, s, b

    _install(hf, lambda i, path, name, old: make(name, i, path, *weights(i, path, old)))
    unused = sorted(set(ck.tensors) - consumed)
    if unused:
        notes.append(f"{len(unused)} checkpoint tensor(s) not used: {', '.join(unused[:8])}" + (" ..." if len(unused) > 8 else ""))
    if ck.quantized and scales == "pow2":
        notes.append("int8 checkpoint weights re-quantized onto power-of-two scales (requantize_weight_pow2)")
    return hf, notes


def build_model(
    model: str = TINY_MODEL,
    *,
    kernel: str | dict[str, Any] | Any = "int8-cutlass-order",
    scales: str = "real",
    seed: int = 0,
    out_dtype: str = "bf16",
    threads: int | None = 1,
    reductions: str = "fp64",
    overrides: dict[str, Any] | None = None,
    attention: str | None = None,
) -> W8A8Model:
    """Build the W8A8 engine.

    Args:
        model: ``"tiny-qwen3"`` (seeded weights, :data:`tasks.models.checkpoint.TINY_QWEN3`), a
            shipped model by name (``"answer-qwen3"``: ``tasks/models/shipped/answer-qwen3``, its sha256 checked
            against its MANIFEST.json; :data:`tasks.models.checkpoint.SHIPPED_MODELS`), or a
            local checkpoint directory (config.json + *.safetensors): a float checkpoint is
            quantized on load, a compressed-tensors W8A8 INT8 checkpoint is loaded as is.
        kernel: the registry kernel every W8A8 layer calls: a name, ``{"kernel": name, "params":
            {...}}``, or a :class:`tasks.kernels.Kernel`.
        scales: ``"real"`` (absmax/127 scales, vLLM's activation quantizer) or ``"pow2"`` (weight
            scales at load and activation scales at run time rounded UP to powers of two before
            quantizing; :mod:`tasks.models.quantization`).
        seed: the weight seed of ``tiny-qwen3`` (recorded, unused, for a checkpoint).
        out_dtype: the GEMM output dtype, ``"bf16"`` (default), ``"fp16"`` or ``"fp32"``.
        threads: torch intra-op threads while the model runs (None: leave torch's setting).
        reductions: ``"fp64"`` (default: attention and lm_head in float64, rounded once to fp32, so
            prefill, decode and padded runs agree bit for bit; :mod:`tasks.models.invariance`) or
            ``"fp32"`` (transformers' eager fp32 attention and lm_head).
        overrides: ``Qwen3Config`` fields changed from the tiny config (``tiny-qwen3`` only),
            e.g. ``{"attention_bias": True}`` or ``{"num_hidden_layers": 2}``.
        attention: an attention kernel of :mod:`tasks.attention` every attention layer calls
            (``"sdpa-math"``, ``"sdpa-flash-cpu"``, ...); None keeps the ``reductions`` choice.
    """
    check_scale_mode(scales)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {', '.join(OUT_DTYPES)}; got {out_dtype!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    odt = OUT_DTYPES[out_dtype]
    k = resolve_kernel(kernel)

    def make(name: str, i: int, path: str, q: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None) -> W8A8Linear:
        return W8A8Linear(q, s, b, kernel=k, scales=scales, out_dtype=odt, name=name, index=i,
                          layer_type=PROJECTIONS[path])

    if model == TINY_MODEL:
        hf = tiny_qwen3_float(seed, reductions, **(overrides or {}))

        def from_float(i: int, path: str, name: str, old: Any) -> W8A8Linear:
            q, s = quantize_weight(old.weight.detach(), scales)
            b = old.bias.detach() if old.bias is not None else None
            return make(name, i, path, q, s, b)

        _install(hf, from_float)
        if attention is not None:
            from tasks.models.hf_attention import use_attention

            use_attention(hf, attention)
        return W8A8Model(hf, model=model, source="seeded", scales=scales, seed=seed, out_dtype=odt,
                         threads=threads, reductions=reductions)
    if overrides:
        raise ValueError("overrides apply to 'tiny-qwen3' only; a checkpoint's config.json is used as it is")
    ck = read_checkpoint(shipped_model_dir(model) if model in SHIPPED_MODELS else Path(model))
    hf, notes = _from_checkpoint(ck, make, scales, reductions)
    if attention is not None:
        from tasks.models.hf_attention import use_attention

        use_attention(hf, attention)
    source = "compressed-tensors" if ck.quantized else "float-checkpoint"
    return W8A8Model(hf, model=str(model), source=source, scales=scales, seed=seed, out_dtype=odt,
                     threads=threads, reductions=reductions, notes=notes)
