"""The vLLM engine adapter: one arm = ``vllm.LLM`` with one INT8/FP8 linear kernel forced (GPU-only).

:class:`VllmEngine` builds ``vllm.LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` set
before vLLM is imported, docs/reference/vllm-kernels.md §4), with ``enforce_eager=True`` (Python hooks
run on every step: no CUDA graphs, no torch.compile, §4), a fixed seed,
``logprobs_mode="raw_logits"`` (§5), prefix caching off, and the kernel forced
(:func:`~tasks.models.vllm_selection.forcing`, §1.1-1.2).  ``generate``/``score`` return
:class:`~tasks.models.GenerationResult` / :class:`~tasks.models.ScoreResult` with the CPU engine's
row shapes (:mod:`.vllm_rows`), ``score_logprobs`` also the float64 log-probability of each next
token from the same captured logits; ``evidence()`` compares the configured kernel with the three
sources -- the ``Selected ... for ...`` log line, each layer's ``type(scheme.kernel)`` and run-time
call counts of the CUTLASS op versus ``triton_scaled_mm`` -- and ``require_evidence()`` raises
:class:`KernelEvidenceError` on a mismatch; ``capture()`` records operands through the selected
kernel's ``apply_weights`` (§4 hook option a) as :class:`~tasks.models.CapturedLayer` objects.

The logic the engine applies lives in :mod:`.vllm_selection` and :mod:`.vllm_rows` (pure, tested
without a GPU) and is re-exported here.

**Status:** this GPU path has not yet run on a GPU.  tests/test_gpu.py
are the checks to run where CUDA and vLLM 0.29-0.32 are; infra/gpu-kit/run.sh (docs/gpu.md) runs the kernels
that need only torch and Triton on a borrowed GPU.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.devices import cuda_reason, vllm_reason, vllm_version

from .predictions import GenerationResult, ScoreResult
from .vllm_rows import (
    FUSED,
    VllmEngineError,
    assemble_logits,
    generation_from_outputs,
    score_from_logits,
    score_from_prompt_logprobs,
    split_fused,
    target_logprobs,
    vllm_layer_name,
)
from .vllm_selection import (
    CLASS_TO_KERNEL,
    FAMILIES,
    CallCounter,
    ForcingError,
    KernelEvidenceError,
    check_evidence,
    forcing,
    kernel_classes,
    layer_gemm_shapes,
    layer_kernels,
    merge_env,
    parse_attention_log,
    parse_selection_log,
    predicted_fallbacks,
    quantized_kernel,
    require_evidence,
    vllm_op_targets,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .capture import Capture, CapturedLayer

__all__ = [
    "FAMILIES",
    "FUSED",
    "CallCounter",
    "ForcingError",
    "KernelEvidenceError",
    "VllmEngine",
    "VllmEngineError",
    "assemble_logits",
    "check_evidence",
    "forcing",
    "generation_from_outputs",
    "kernel_classes",
    "layer_gemm_shapes",
    "layer_kernels",
    "merge_env",
    "parse_selection_log",
    "predicted_fallbacks",
    "require_evidence",
    "runtime_reason",
    "score_from_logits",
    "score_from_prompt_logprobs",
    "split_fused",
    "vllm_layer_name",
    "vllm_op_targets",
]


# ---------------------------------------------------------------------------------------------
# the engine (GPU-only)


class _LogCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # a bad log call must not break the engine
            self.lines.append(str(record.msg))


#: Kernel-selecting env of the first engine built in this process (vLLM's choice is per process,
#: ``info_once`` is process-cached and env values may be cached after start-up; §4, §7.5).
_PROCESS_ENGINES: list[dict[str, str]] = []


def configure_vllm_logging() -> bool:
    """Apply vLLM's own logging configuration now, as ``LLM.__init__`` would on its first call in a
    process (vLLM 0.32: entrypoints/llm.py calls ``configure_logging_if_needed(engine_args.
    create_logging_config())``, whose first call runs ``logging.config.dictConfig`` with a config that
    names the ``vllm`` logger -- and ``dictConfig`` removes the handlers a logger it configures already
    has). Done before a handler is attached, ``LLM()`` then finds the same config active and leaves it
    (and the handler) alone. Returns whether it was applied: vLLM before ``configure_logging_if_needed``
    configured its logging at import, which has happened by then."""
    try:
        configure = importlib.import_module("vllm.logger").configure_logging_if_needed
        from vllm.config.logging import LoggingConfig
    except (ImportError, AttributeError):
        return False
    configure(LoggingConfig())
    return True


def runtime_reason() -> str | None:
    """Why :class:`VllmEngine` cannot run here (CUDA, vLLM 0.29-0.32), or None."""
    reasons = [r for r in (cuda_reason(), vllm_reason()) if r]
    return "; ".join(reasons) if reasons else None


def _find_model(llm: Any) -> Any:
    """The ``nn.Module`` in this process (in-process engine, TP=1; §4)."""
    paths = (
        ("llm_engine", "model_executor", "driver_worker", "worker", "model_runner"),
        ("llm_engine", "model_executor", "driver_worker", "model_runner"),
    )
    for path in paths:
        obj: Any = llm
        for attr in path:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        if obj is not None:
            get = getattr(obj, "get_model", None)
            model = get() if callable(get) else getattr(obj, "model", None)
            if model is not None:
                return model
    raise VllmEngineError(
        "cannot reach the model in this process (llm.llm_engine.model_executor.driver_worker...): "
        "was VLLM_ENABLE_V1_MULTIPROCESSING=0 set before vllm was imported? (§4)"
    )


@dataclass
class _LayerHook:
    name: str
    module: Any
    kernel: Any
    original: Any
    calls: dict[str, int] = field(default_factory=dict)


class VllmEngine:
    """One arm on vLLM: ``vllm.LLM`` with ``kernel`` forced (GPU-only; see module docstring).

    Args:
        model: a local checkpoint directory or a model name the machine can load offline.
        kernel: a family of :data:`FAMILIES` (``cutlass-int8``, ``triton-int8``, ``cutlass-fp8``,
            ``torch-fp8``; aliases ``cutlass``, ``triton``, ``torch``).
        seed: ``LLM(seed=...)`` and the sampling seed.
        dtype: the model dtype (``"bfloat16"``: vLLM's INT8 ops write bf16 or fp16, §2.1).
        max_logprobs: ``LLM(max_logprobs=...)``; ``top_k + 1`` must not exceed it.
        env: the arm's own environment (united with the forcing's ``VLLM_DISABLED_KERNELS``).
        mechanism: how to force (:func:`forcing`).
        max_model_len, gpu_memory_utilization: passed to ``LLM``.
        llm_kwargs: further ``LLM``/``EngineArgs`` keyword arguments (override the defaults).
        attention_backend: vLLM's attention backend (an ``AttentionBackendEnum`` name, e.g.
            ``FLASH_ATTN``) passed as ``LLM(attention_backend=...)``; the backend vLLM logs using must
            be it (:meth:`require_evidence`). None: vLLM's own choice, recorded.

    Raises:
        VllmEngineError: no CUDA, no vLLM 0.29-0.32, a second engine with other kernel env in this
            process, or a model that cannot be reached in this process.
        ForcingError: the family cannot be forced in the installed version.
    """

    def __init__(
        self,
        model: str,
        *,
        kernel: str = "cutlass-int8",
        seed: int = 0,
        dtype: str = "bfloat16",
        max_logprobs: int = 20,
        env: Mapping[str, str] | None = None,
        mechanism: str = "env",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.85,
        llm_kwargs: Mapping[str, Any] | None = None,
        attention_backend: str | None = None,
    ) -> None:
        reason = runtime_reason()
        if reason:
            raise VllmEngineError(f"the vLLM engine cannot run here: {reason}")
        version = vllm_version()
        if version is None:  # runtime_reason() said it was installed; it is gone now
            raise VllmEngineError("the vLLM engine cannot run here: vllm not installed")
        self.model = str(model)
        self.seed = int(seed)
        self.dtype = dtype
        self.max_logprobs = int(max_logprobs)
        self.vllm_version = version
        self.forced = forcing(kernel, version, mechanism)
        self.env = merge_env(self.forced, env)
        self.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: hooks see the model (§4)
        self.attention_backend = attention_backend
        selecting = {k: v for k, v in self.env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        if attention_backend is not None:  # vLLM caches its attention choice per process too
            selecting["attention_backend"] = attention_backend
        if _PROCESS_ENGINES and _PROCESS_ENGINES[0] != selecting:
            raise VllmEngineError(
                f"a vLLM engine with other kernel-selecting env ({_PROCESS_ENGINES[0]}) was already built in "
                f"this process; vLLM chooses kernels once per process (§4, §7.5): run each arm in a fresh process"
            )
        self.require_log = not _PROCESS_ENGINES
        os.environ.update(self.env)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        import vllm  # after the env: VLLM_ENABLE_V1_MULTIPROCESSING is read at engine creation (§4)

        self._vllm = vllm
        kwargs: dict[str, Any] = {
            "model": self.model,
            "seed": self.seed,
            "dtype": dtype,
            "enforce_eager": True,  # no CUDA graphs, no torch.compile: hooks run every step (§4)
            "logprobs_mode": "raw_logits",  # Logprob.logprob holds the raw logit (§5)
            "max_logprobs": self.max_logprobs,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_prefix_caching": False,  # every unit computes every position
            "skip_tokenizer_init": True,  # prompts are token ids
            **self.forced["llm_kwargs"],
            **({"attention_backend": attention_backend} if attention_backend is not None else {}),
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
            kwargs.setdefault("max_num_batched_tokens", int(max_model_len))  # no chunked prefill
        kwargs.update(dict(llm_kwargs or {}))
        self.llm_kwargs = {k: v for k, v in kwargs.items() if k != "model"}
        #: What vLLM's prompt "logprobs" hold: its runners follow logprobs_mode for prompt scores too.
        mode = str(kwargs["logprobs_mode"])
        self.prompt_values = mode if mode in ("raw_logits", "processed_logits") else "logprobs"
        configure_vllm_logging()  # what LLM() does first: done now, it does not redo it and drop our handler
        logger = logging.getLogger("vllm")
        collector = _LogCollector()
        logger.addHandler(collector)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
        try:
            self.llm = vllm.LLM(**kwargs)
            if collector not in logger.handlers:
                raise VllmEngineError(
                    "vLLM configured its logging again while the engine was built and removed swapcheck's log "
                    "collector: the kernel-selection lines are lost (a logging_config or log_level in llm_kwargs "
                    "that differs from vLLM's default?)")
        finally:
            logger.removeHandler(collector)
        _PROCESS_ENGINES.append(selecting)
        #: The model's vocabulary (``ModelConfig.get_vocab_size``), for :meth:`_requests`.
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.log_lines = collector.lines
        self.module = _find_model(self.llm)
        self.layers = layer_kernels(self.module)
        self.shapes = layer_gemm_shapes(self.module)
        self._hooks = self._install_layer_hooks()
        self._ops = CallCounter(vllm_op_targets(version))
        self._recorder: Callable[..., None] | None = None
        self._weights_sha256: str | None = None

    # -- hooks -------------------------------------------------------------------------------------
    def _install_layer_hooks(self) -> dict[str, _LayerHook]:
        hooks: dict[str, _LayerHook] = {}
        seen: set[int] = set()
        for name, mod in self.module.named_modules():
            kern = quantized_kernel(mod)
            if kern is None or id(kern) in seen or not hasattr(kern, "apply_weights"):
                continue
            seen.add(id(kern))
            hook = _LayerHook(name, mod, kern, kern.apply_weights)
            kern.apply_weights = self._wrap_apply(hook)
            hooks[name] = hook
        return hooks

    def _wrap_apply(self, hook: _LayerHook) -> Callable[..., Any]:
        cls = type(hook.kernel).__name__

        def apply_weights(layer: Any, x: Any, bias: Any = None) -> Any:
            out = hook.original(layer, x, bias)
            hook.calls[cls] = hook.calls.get(cls, 0) + 1
            if self._recorder is not None:
                self._recorder(hook.name, layer, x, bias, out, cls)
            return out

        return apply_weights

    def kernel_calls(self) -> dict[str, dict[str, int]]:
        """Per layer, how many times each kernel class's ``apply_weights`` ran (since the last reset)."""
        return {name: dict(h.calls) for name, h in self._hooks.items()}

    def op_calls(self) -> dict[str, int]:
        """Run-time calls by op label (:func:`vllm_op_targets`) during generate/score."""
        return dict(self._ops.counts)

    def reset_kernel_calls(self) -> None:
        for h in self._hooks.values():
            h.calls.clear()
        self._ops.reset()

    # -- evidence ----------------------------------------------------------------------------------
    def evidence(self) -> dict[str, Any]:
        """The three sources compared with the forcing (:func:`check_evidence`), plus identity."""
        ev = check_evidence(
            self.forced,
            log_pairs=parse_selection_log("\n".join(self.log_lines)),
            layers=self.layers,
            layer_calls=self.kernel_calls() if any(h.calls for h in self._hooks.values()) else None,
            op_calls=self.op_calls() if any(self._ops.counts.values()) else None,
            hooks_missing=self._ops.missing,
            shapes=self.shapes,
            require_log=self.require_log,
            attention=self.attention_backend,
            attention_log=parse_attention_log("\n".join(self.log_lines)),
        )
        ev["env"] = dict(self.env)
        ev["llm_kwargs"] = {k: v for k, v in self.llm_kwargs.items() if _jsonable(v)}
        return ev

    def require_evidence(self) -> dict[str, Any]:
        """:meth:`evidence`, or :class:`KernelEvidenceError` when configured and observed differ."""
        ev = self.evidence()
        require_evidence(ev)
        return ev

    # -- running -----------------------------------------------------------------------------------
    def _check_top_k(self, top_k: int) -> None:
        if top_k < 1 or top_k + 1 > self.max_logprobs:
            raise VllmEngineError(
                f"top_k={top_k}: the engine asks vLLM for top_k + 1 logprobs and was built with "
                f"max_logprobs={self.max_logprobs}; build it with max_logprobs >= {top_k + 1}"
            )

    def _requests(self, token_lists: Sequence[Sequence[int]], what: str) -> list[dict[str, list[int]]]:
        """vLLM's requests; ids outside the model's vocabulary are refused here, since vLLM does not
        check prompt ids when it skips the tokenizer (issue #37)."""
        if not token_lists:
            raise ValueError(f"{what} must be a non-empty list of token-id lists")
        vocab = self.vocab_size
        out = []
        for i, toks in enumerate(token_lists):
            ids = [int(t) for t in toks]
            if not ids:
                raise ValueError(f"{what}[{i}] is empty")
            if any(t < 0 or t >= vocab for t in ids):
                raise ValueError(f"{what}[{i}] holds token ids outside the model's vocabulary of {vocab} "
                                 f"(e.g. {next(t for t in ids if t < 0 or t >= vocab)})")
            out.append({"prompt_token_ids": ids})
        return out

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, top_k: int = 5) -> GenerationResult:
        """Greedy generation of ``max_new_tokens`` tokens per prompt (EOS ignored), one batch.

        Rows as the CPU engine's (:func:`generation_from_outputs`), values raw logits.
        """
        self._check_top_k(top_k)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        reqs = self._requests(prompts, "prompts")
        sp = self._vllm.SamplingParams(temperature=0.0, max_tokens=int(max_new_tokens), logprobs=top_k + 1,
                                       ignore_eos=True, detokenize=False, seed=self.seed)
        with self._ops:
            outs = self.llm.generate(reqs, sp, use_tqdm=False)
        res = generation_from_outputs([r["prompt_token_ids"] for r in reqs], outs, top_k)
        if res.info["argmax_mismatches"]:
            raise VllmEngineError(
                f"{res.info['argmax_mismatches']} generated tokens are not the top-1 raw logit (first at "
                f"{res.info['first_argmax_mismatch']}): decoding was not greedy"
            )
        res.info.update({"kernel": self.forced["family"], "vllm": self.vllm_version})
        return res

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 5, values: str = "logits") -> ScoreResult:
        """Teacher-forced scores of every position (:class:`ScoreResult`).

        ``values="logits"`` (default): each sequence is its own request and the raw logits are
        taken from the model's ``compute_logits`` (:func:`assemble_logits`), then ranked exactly as
        the CPU engine ranks them.  ``values="logprobs"``: one batched call, vLLM's
        ``prompt_logprobs`` mapped by :func:`score_from_prompt_logprobs`.
        """
        return self._score(sequences, top_k, values, logprobs=False)[0]

    def score_logprobs(self, sequences: Sequence[Sequence[int]], top_k: int = 5,
                       starts: Sequence[int] | None = None) -> tuple[ScoreResult, list[np.ndarray]]:
        """:meth:`score` with ``values="logits"``, and per sequence the float64 log-probability of
        each next token from the same captured full-vocabulary logits (:func:`target_logprobs`: one
        array per sequence, NaN at the last position and before ``starts[i]``, e.g. the prompt's
        positions). What the teacher-forced probability columns of vLLM arms are built from
        (tasks/kinds/teacher_forced.py)."""
        if starts is not None and len(starts) != len(sequences):
            raise ValueError(f"{len(starts)} starts for {len(sequences)} sequences")
        return self._score(sequences, top_k, "logits", logprobs=True, starts=starts)

    def _score(self, sequences: Sequence[Sequence[int]], top_k: int, values: str, logprobs: bool,
               starts: Sequence[int] | None = None) -> tuple[ScoreResult, list[np.ndarray]]:
        self._check_top_k(top_k)
        if values not in ("logits", "logprobs"):
            raise ValueError(f"values must be 'logits' or 'logprobs', got {values!r}")
        reqs = self._requests(sequences, "sequences")
        sp = self._vllm.SamplingParams(temperature=0.0, max_tokens=1, logprobs=top_k + 1,
                                       prompt_logprobs=top_k + 1, detokenize=False, seed=self.seed)
        seqs = [r["prompt_token_ids"] for r in reqs]
        lps: list[np.ndarray] = []
        if values == "logprobs":
            with self._ops:
                outs = self.llm.generate(reqs, sp, use_tqdm=False)
            res = score_from_prompt_logprobs(seqs, outs, top_k, prompt_values=self.prompt_values)
        else:
            # One sequence at a time, its [L, V] logits reduced to the rows' arrays (and the target
            # log-probabilities) before the next: never every sequence's full logits at once.
            res = ScoreResult([list(s) for s in seqs], info={"engine": "vllm", "values": "raw_logits"})
            for i, (req, seq) in enumerate(zip(reqs, seqs, strict=True)):
                captured: list[torch.Tensor] = []
                with self._ops, self._logits_hook(captured):
                    out = self.llm.generate([req], sp, use_tqdm=False)[0]
                lg = assemble_logits(captured, len(seq), int(out.outputs[0].token_ids[0]), out.prompt_logprobs,
                                     prompt_values=self.prompt_values)
                one = score_from_logits([seq], [lg], top_k)
                res.append(one.argmax[0], one.topk_ids[0], one.topk_logits[0], one.margins[0], one.targets[0],
                           one.target_logits[0])
                if logprobs:
                    lps.append(target_logprobs(lg, seq, 0 if starts is None else starts[i]))
                del captured, lg
        res.info.update({"kernel": self.forced["family"], "vllm": self.vllm_version})
        return res, lps

    @contextmanager
    def _logits_hook(self, sink: list[torch.Tensor]) -> Iterator[None]:
        original = getattr(self.module, "compute_logits", None)
        if original is None:
            raise VllmEngineError("the model has no compute_logits; use score(values='logprobs')")

        def compute_logits(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if out is not None:
                sink.append(out.detach().clone())
            return out

        own = "compute_logits" in vars(self.module)  # an instance attribute rather than the method
        self.module.compute_logits = compute_logits
        try:
            yield
        finally:
            if own:
                self.module.compute_logits = original
            else:
                del self.module.compute_logits  # the class's method shows through again

    # -- capture -----------------------------------------------------------------------------------
    @contextmanager
    def capture(self, split: bool = True) -> Iterator[Capture]:
        """Record every quantized layer call inside the block as CapturedLayer objects (INT8).

        The activation operands are recomputed from the layer's input with the same
        ``ops.scaled_int8_quant`` call both INT8 kernels make (§2.6; its per-token absmax is
        order-independent, so the result is the one the kernel used); the weight operands are the
        layer's own ``weight`` (``[K, N]`` column-major, stored as ``w_q`` ``[N, K]``) and
        ``weight_scale``.  Tensors are moved to the CPU.  ``split`` turns each fused
        ``qkv_proj``/``gate_up_proj`` call into its projections (:func:`split_fused`), so the
        layer names match the CPU engine's.  The recorded ``kernel`` is the registry kernel
        (``vllm-cutlass``/``vllm-triton``) of the layer's class.
        """
        from .capture import Capture

        if self._recorder is not None:
            raise RuntimeError("engine.capture() blocks cannot be nested")
        cap = Capture(meta=self.identity())
        calls: dict[str, int] = {}

        def record(name: str, layer: Any, x: Any, bias: Any, out: Any, cls: str) -> None:
            for c in self._captured(name, layer, x, bias, out, cls, calls, split):
                cap.layers.append(c)

        self._recorder = record
        try:
            yield cap
        finally:
            self._recorder = None

    def _captured(self, name: str, layer: Any, x: Any, bias: Any, out: Any, cls: str,
                  calls: dict[str, int], split: bool) -> list[CapturedLayer]:
        from .capture import CapturedLayer

        kernel = CLASS_TO_KERNEL.get(cls)
        if kernel is None:
            raise VllmEngineError(f"capture supports the INT8 CUTLASS and Triton kernels; layer {name} runs {cls}")
        if getattr(layer, "azp_adj", None) is not None:
            raise VllmEngineError(f"layer {name}: asymmetric activations (azp) cannot be captured (§2.3)")
        ops = importlib.import_module("vllm._custom_ops")
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        x_q, x_s, _ = ops.scaled_int8_quant(x2, getattr(layer, "input_scale", None), None, symmetric=True)
        w = layer.weight  # [K, N], the column-major view of the [N, K] checkpoint weight (§3)
        n = int(w.shape[1])
        short, index, kind = vllm_layer_name(name)
        call = calls.get(short, 0)
        calls[short] = call + 1
        c = CapturedLayer(
            name=short,
            index=index,
            layer_type=kind,
            x_q=x_q.cpu(),
            x_scale=x_s.reshape(-1, 1).float().cpu(),
            w_q=w.t().contiguous().cpu(),
            w_scale=layer.weight_scale.reshape(-1).float().cpu(),
            bias=None if bias is None else bias.contiguous().cpu(),
            output=out.reshape(-1, n).cpu(),
            kernel=kernel,
            kernel_params={},
            call=call,
        )
        sizes = getattr(layer, "output_sizes", None)
        if split and sizes is not None:
            return split_fused(c, [int(s) for s in sizes], calls)
        return [c]

    # -- identity and teardown ---------------------------------------------------------------------
    def weights_sha256(self) -> str | None:
        """sha256 over a local checkpoint's config.json and *.safetensors (names and bytes), or None
        for a model name; computed once."""
        if self._weights_sha256 is not None:
            return self._weights_sha256
        root = Path(self.model)
        if not root.is_dir():
            return None
        h = hashlib.sha256()
        for f in sorted([*root.glob("*.safetensors"), root / "config.json"]):
            if not f.exists():
                continue
            h.update(f.name.encode() + b"|")
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 24), b""):
                    h.update(chunk)
        self._weights_sha256 = h.hexdigest()
        return self._weights_sha256

    def identity(self) -> dict[str, Any]:
        """Provenance: model, versions, device, forcing, env, LLM arguments, seed, weights hash."""
        import torch

        return {
            "engine": "vllm",
            "model": self.model,
            "kernel": self.forced["family"],
            "forcing": {k: v for k, v in self.forced.items() if k != "notes"},
            "env": dict(self.env),
            "llm_kwargs": {k: v for k, v in self.llm_kwargs.items() if _jsonable(v)},
            "seed": self.seed,
            "dtype": self.dtype,
            "vllm": self.vllm_version,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device_name": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "quantized_layers": len(self.layers),
            "weights_sha256": self.weights_sha256(),
        }

    def close(self) -> None:
        """Drop the engine and free GPU memory (the process keeps vLLM's per-process state)."""
        import torch

        for h in self._hooks.values():
            try:
                del h.kernel.apply_weights
            except AttributeError:
                pass
        self._hooks = {}
        self.llm = None
        gc.collect()
        torch.cuda.empty_cache()


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, bool | int | float | str | list | tuple | dict)
