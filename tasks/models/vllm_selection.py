"""Which kernel vLLM runs: forcing a kernel family per version, and the evidence of what ran.

Pure logic, tested without a GPU (tests/test_vllm_logic.py); :mod:`.vllm_engine` applies it.

* :func:`forcing` -- the environment and ``LLM`` keyword arguments that force a kernel family in a
  vLLM version (docs/reference/vllm-kernels.md §1.1-1.2), and what must then be observed;
* :func:`parse_selection_log` -- the ``Selected <kernel> for <scheme>`` (0.16+) and ``Using <kernel>
  for <scheme>`` (<= 0.14) log lines (§1.3);
* :func:`layer_kernels` -- ``type(module.scheme.kernel).__name__`` per named module (§1.3), and
  :func:`predicted_fallbacks` -- the CUTLASS layers whose shapes make it run Triton (§1.2 Pitfall 1);
* :class:`CallCounter` and :func:`vllm_op_targets` -- run-time call counts of the CUTLASS op versus
  ``triton_scaled_mm`` by wrapping module attributes (§4 hook options b and c);
* :func:`check_evidence` / :func:`require_evidence` -- the configured kernel against the three
  sources; a mismatch is a :class:`KernelEvidenceError`: a run that did not test what it claims
  must never count.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tasks.devices import parse_version
from tasks.kernels.cuda import ALIGNMENT, TRITON_SCALED_MM_MODULE
from tasks.models.evidence import kernel_evidence

__all__ = [
    "CLASS_TO_KERNEL",
    "FAMILIES",
    "MECHANISMS",
    "CallCounter",
    "ForcingError",
    "KernelEvidenceError",
    "check_evidence",
    "forcing",
    "kernel_classes",
    "layer_gemm_shapes",
    "layer_kernels",
    "merge_env",
    "parse_selection_log",
    "parse_attention_log",
    "attention_problems",
    "predicted_fallbacks",
    "quantized_kernel",
    "require_evidence",
    "resolve_object",
    "vllm_op_targets",
]


class ForcingError(ValueError):
    """A kernel family that cannot be forced (or verified) in the given vLLM version."""


class KernelEvidenceError(RuntimeError):
    """The kernel observed at run time is not the kernel the arm configured."""


# ---------------------------------------------------------------------------------------------
# forcing a kernel family per vLLM version (§1.1, §1.2)

#: Kernel families an arm may name, with what each runs.
FAMILIES: dict[str, str] = {
    "cutlass-int8": "CUTLASS INT8 (cutlass_scaled_mm)",
    "triton-int8": "Triton INT8 (triton_scaled_mm)",
    "cutlass-fp8": "CUTLASS FP8 (cutlass_scaled_mm)",
    "torch-fp8": "torch._scaled_mm FP8 (cuBLASLt)",
}
_ALIASES = {"cutlass": "cutlass-int8", "triton": "triton-int8", "torch": "torch-fp8"}
#: The run-time op each family must call (labels of :func:`vllm_op_targets`).
_FAMILY_OP = {"cutlass-int8": "cutlass", "triton-int8": "triton", "cutlass-fp8": "cutlass", "torch-fp8": "torch"}
#: ``linear_backend`` value per family (0.25+, §1.2 "Alternative switch").
_FAMILY_BACKEND = {"cutlass-int8": "cutlass", "triton-int8": "triton", "cutlass-fp8": "cutlass", "torch-fp8": "torch"}
MECHANISMS = ("env", "linear_backend", "both")
#: Kernel classes whose names the registry kernels stand for (used for captures).
CLASS_TO_KERNEL = {
    "CutlassInt8ScaledMMLinearKernel": "vllm-cutlass",
    "CutlassScaledMMLinearKernel": "vllm-cutlass",
    "TritonInt8ScaledMMLinearKernel": "vllm-triton",
    "TritonScaledMMLinearKernel": "vllm-triton",
}
_MAX_READ = (0, 33)  # the newest release the reference read


def _family(name: str) -> str:
    fam = _ALIASES.get(name, name)
    if fam not in FAMILIES:
        allowed = ", ".join([*FAMILIES, *(f"{a} (= {f})" for a, f in _ALIASES.items())])
        raise ForcingError(f"unknown kernel family {name!r}; allowed: {allowed}")
    return fam


def _version(vllm_version_text: str) -> tuple[int, int, int]:
    v = parse_version(vllm_version_text)
    if v is None:
        raise ForcingError(f"cannot read the vLLM version {vllm_version_text!r} (expected e.g. '0.32.0')")
    return v


def kernel_classes(vllm_version_text: str) -> dict[str, str]:
    """The scaled-mm kernel class names of a vLLM version, by role (§1.1).

    Roles: ``cutlass-int8``, ``triton-int8`` (all versions read), ``humming-int8`` (0.25+; named
    from 0.16 on, where disabling a class that does not exist is harmless: the selector compares
    strings), and from 0.29 the FP8 roles ``flashinfer-fp8``, ``cutlass-fp8``, ``b12x-fp8``,
    ``pertensor-torch-fp8``, ``channelwise-torch-fp8``, ``rowwise-torch-fp8`` (names read from
    0.32.0, §1.1; the same ``kernels/linear`` package from 0.25).
    """
    v = _version(vllm_version_text)
    if v[:2] < (0, 11):
        raise ForcingError(f"vLLM {vllm_version_text}: the reference has no facts before 0.11 (§1.1)")
    if v[:2] == (0, 15):
        raise ForcingError(
            "vLLM 0.15 was not checked (§1.1): its class names are either the <= 0.14 or the "
            ">= 0.16 ones; use a version the reference read"
        )
    if v[:2] > _MAX_READ:
        raise ForcingError(f"vLLM {vllm_version_text}: the reference read versions up to 0.33 only")
    if v[:2] < (0, 16):
        return {"cutlass-int8": "CutlassScaledMMLinearKernel", "triton-int8": "TritonScaledMMLinearKernel"}
    roles = {
        "cutlass-int8": "CutlassInt8ScaledMMLinearKernel",
        "triton-int8": "TritonInt8ScaledMMLinearKernel",
        "humming-int8": "HummingInt8ScaledMMLinearKernel",
    }
    if v[:2] >= (0, 29):
        roles.update({
            "flashinfer-fp8": "FlashInferFP8ScaledMMLinearKernel",
            "cutlass-fp8": "CutlassFP8ScaledMMLinearKernel",
            "b12x-fp8": "B12xTensorFP8ScaledMMLinearKernel",
            "pertensor-torch-fp8": "PerTensorTorchFP8ScaledMMLinearKernel",
            "channelwise-torch-fp8": "ChannelWiseTorchFP8ScaledMMLinearKernel",
            "rowwise-torch-fp8": "RowWiseTorchFP8ScaledMMLinearKernel",
        })
    return roles


def forcing(kernel_family: str, vllm_version: str, mechanism: str = "env") -> dict[str, Any]:
    """How to force ``kernel_family`` in ``vllm_version``, and what must then be observed.

    Args:
        kernel_family: ``cutlass-int8`` (alias ``cutlass``), ``triton-int8`` (``triton``),
            ``cutlass-fp8`` or ``torch-fp8`` (``torch``).
        vllm_version: the installed version, e.g. ``"0.32.0"``.
        mechanism: ``"env"`` (``VLLM_DISABLED_KERNELS``, every version), ``"linear_backend"``
            (``LLM(linear_backend=...)``, 0.25+) or ``"both"``.

    Returns:
        ``{"family", "vllm", "mechanism", "env", "llm_kwargs", "expected_classes", "expected_op",
        "log_verb", "notes"}``: ``env`` holds ``VLLM_DISABLED_KERNELS`` as exact class names
        joined by commas with no spaces (vLLM splits on "," and strips nothing, §1.2);
        ``expected_classes`` the kernel classes a forced layer may have; ``expected_op`` the
        run-time op label (:func:`vllm_op_targets`) it must call; ``log_verb`` ``"Selected"``
        (0.16+) or ``"Using"`` (<= 0.14, §1.3).

    Raises:
        ForcingError: an unknown family or mechanism, or a family the version cannot run or
            force (Triton INT8 before 0.13; FP8 before 0.29; ``linear_backend`` before 0.25).
    """
    fam = _family(kernel_family)
    if mechanism not in MECHANISMS:
        raise ForcingError(f"unknown forcing mechanism {mechanism!r}; allowed: {', '.join(MECHANISMS)}")
    v = _version(vllm_version)
    roles = kernel_classes(vllm_version)  # refuses versions the reference has no facts for
    notes: list[str] = []
    if fam == "triton-int8" and v[:2] < (0, 13):
        raise ForcingError(
            f"vLLM {vllm_version}: Triton INT8 is not a CUDA candidate before 0.13, and its class "
            "runs CUTLASS there (vllm-kernels.md §1.1); use vLLM 0.29-0.32"
        )
    if fam.endswith("fp8") and v[:2] < (0, 29):
        raise ForcingError(
            f"vLLM {vllm_version}: FP8 kernel forcing is supported from 0.29 (class names read from "
            "0.32, §1.1); <= 0.14 used Fp8LinearOp, which VLLM_DISABLED_KERNELS does not affect"
        )
    if mechanism != "env" and v[:2] < (0, 25):
        raise ForcingError(f"vLLM {vllm_version}: linear_backend exists from 0.25 (§1.2); use mechanism='env'")
    if fam == "cutlass-int8":
        expected = [roles["cutlass-int8"]]
        disabled = [roles[r] for r in ("triton-int8", "humming-int8") if r in roles and v[:2] >= (0, 13)]
        if v[:2] < (0, 13):
            notes.append("CUTLASS is the only INT8 CUDA candidate before 0.13 (§1.1)")
        else:
            notes.append("CUTLASS is first in the INT8 list; the others are disabled for safety (§1.2)")
    elif fam == "triton-int8":
        expected = [roles["triton-int8"]]
        disabled = [roles["cutlass-int8"]]
    elif fam == "cutlass-fp8":
        expected = [roles["cutlass-fp8"]]
        disabled = [roles["flashinfer-fp8"], roles["b12x-fp8"]]
        notes.append("CUTLASS FP8 pads weights to 16 in 0.32, so it has no Triton fallback (§1.2)")
    else:  # torch-fp8
        expected = [roles[r] for r in ("pertensor-torch-fp8", "channelwise-torch-fp8", "rowwise-torch-fp8")]
        disabled = [roles["flashinfer-fp8"], roles["cutlass-fp8"], roles["b12x-fp8"]]
        notes.append("per-tensor scales select PerTensorTorch..., others ChannelWiseTorch... (§1.2)")
    env: dict[str, str] = {}
    llm_kwargs: dict[str, Any] = {}
    if mechanism in ("env", "both"):
        env["VLLM_DISABLED_KERNELS"] = ",".join(disabled)
    if mechanism in ("linear_backend", "both"):
        llm_kwargs["linear_backend"] = _FAMILY_BACKEND[fam]
        notes.append("a backend with no kernel for a layer type falls back to automatic selection with a warning (§1.2)")
    if fam == "cutlass-int8":
        notes.append(f"K or N not a multiple of {ALIGNMENT} silently runs triton_scaled_mm (§1.2 Pitfall 1)")
    return {
        "family": fam,
        "vllm": vllm_version,
        "mechanism": mechanism,
        "env": env,
        "llm_kwargs": llm_kwargs,
        "expected_classes": expected,
        "expected_op": _FAMILY_OP[fam],
        "log_verb": "Selected" if v[:2] >= (0, 16) else "Using",
        "notes": notes,
    }


def merge_env(forced: Mapping[str, Any], arm_env: Mapping[str, str] | None) -> dict[str, str]:
    """The forcing's env with an arm's own env; ``VLLM_DISABLED_KERNELS`` lists are united.

    Raises:
        ForcingError: the arm's env disables a class the forcing needs.
    """
    env = dict(forced["env"])
    for key, value in (arm_env or {}).items():
        if key == "VLLM_DISABLED_KERNELS" and key in env:
            names = [n for n in (env[key].split(",") + str(value).split(",")) if n]
            env[key] = ",".join(dict.fromkeys(names))
        else:
            env[key] = str(value)
    disabled = set(env.get("VLLM_DISABLED_KERNELS", "").split(","))
    clash = sorted(disabled & set(forced["expected_classes"]))
    if clash:
        raise ForcingError(
            f"the arm's env disables {', '.join(clash)}, the kernel it is meant to run "
            f"(VLLM_DISABLED_KERNELS={env['VLLM_DISABLED_KERNELS']})"
        )
    return env


# ---------------------------------------------------------------------------------------------
# the selection log lines (§1.3)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SELECTION = re.compile(r"\b(?:Selected|Using)\s+([A-Za-z_]\w*Kernel)\s+for\s+([A-Za-z_]\w*)")


def parse_selection_log(text: str) -> list[tuple[str, str]]:
    """``(kernel_class, scheme)`` pairs from vLLM log text, first-seen order, without repeats.

    Matches ``Selected CutlassInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8`` (0.16+,
    ``logger.info_once``) and ``Using CutlassScaledMMLinearKernel for CompressedTensorsW8A8Int8``
    (<= 0.14), anywhere in a line (vLLM's prefix ``INFO mm-dd hh:mm:ss [file:line]`` and ANSI
    colours are ignored).  The class must end in ``Kernel``, so other "Using ... for ..." lines
    do not match.  The scheme is the scheme *class* name, not the layer name (§1.3).
    """
    seen: dict[tuple[str, str], None] = {}
    for m in _SELECTION.finditer(_ANSI.sub("", text)):
        seen.setdefault((m.group(1), m.group(2)), None)
    return list(seen)


#: vLLM 0.32's attention selection lines (platforms/cuda.py): ``Using %s backend.`` with the selected
#: ``AttentionBackendEnum`` member (its str: ``AttentionBackendEnum.FLASH_ATTN``) when one was asked
#: for, ``Using %s attention backend out of potential backends: %s.`` with its name otherwise.
_ATTENTION = re.compile(r"\bUsing\s+(?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]*)\s+(?:attention\s+)?backend\b")


def parse_attention_log(text: str) -> list[str]:
    """The attention backends vLLM logged choosing (``FLASH_ATTN``, ...), first-seen order, no repeats."""
    seen: dict[str, None] = {}
    for m in _ATTENTION.finditer(_ANSI.sub("", text)):
        seen.setdefault(m.group(1), None)
    return list(seen)


def attention_problems(configured: str | None, observed: Sequence[str] | None, require_log: bool) -> list[str]:
    """What is wrong with the attention evidence: a configured backend (``LLM(attention_backend=...)``)
    that is not the one vLLM logged using, or no such line where one is required. An arm without a
    configured backend only records what ran."""
    if configured is None or observed is None:
        return []
    if not observed:
        return [f"attention backend {configured} was configured, but vLLM logged no 'Using ... backend' line "
                "(was the log level above INFO?)"] if require_log else []
    if set(observed) != {configured}:
        return [f"attention backend {configured} was configured, but vLLM logged using {', '.join(observed)}"]
    return []


# ---------------------------------------------------------------------------------------------
# per-layer kernel classes (§1.3)


def quantized_kernel(mod: Any) -> Any:
    """The kernel object of a quantized linear module: ``scheme.kernel`` (INT8), ``scheme.fp8_linear``
    (FP8), or the same on ``quant_method`` (``quantization="fp8"``); None for other modules."""
    for holder in (getattr(mod, "scheme", None), getattr(mod, "quant_method", None)):
        if holder is None:
            continue
        for attr in ("kernel", "fp8_linear"):
            k = getattr(holder, attr, None)
            if k is not None:
                return k
    return None


def layer_kernels(module_tree: Any) -> dict[str, str]:
    """``{module name: type(module.scheme.kernel).__name__}`` over ``module_tree.named_modules()``.

    What ``llm.apply_model`` would return with the reference's lambda (§1.3).  Stronger than the
    log line (one line per process), weaker than run-time counts (Pitfall 1).
    """
    out: dict[str, str] = {}
    for name, mod in module_tree.named_modules():
        k = quantized_kernel(mod)
        if k is not None:
            out[name] = type(k).__name__
    return out


def layer_gemm_shapes(module_tree: Any) -> dict[str, tuple[int, int]]:
    """``{module name: (K, N)}`` of every quantized linear (``input_size_per_partition`` and
    ``output_size_per_partition`` of vLLM's ``LinearBase``; else ``weight`` read as ``[K, N]``,
    its layout after ``process_weights_after_loading``, §3)."""
    out: dict[str, tuple[int, int]] = {}
    for name, mod in module_tree.named_modules():
        if quantized_kernel(mod) is None:
            continue
        k = getattr(mod, "input_size_per_partition", None)
        n = getattr(mod, "output_size_per_partition", None)
        if k is None or n is None:
            w = getattr(mod, "weight", None)
            if w is None or len(getattr(w, "shape", ())) != 2:
                continue
            k, n = int(w.shape[0]), int(w.shape[1])
        out[name] = (int(k), int(n))
    return out


def predicted_fallbacks(layers: Mapping[str, str], shapes: Mapping[str, tuple[int, int]]) -> list[str]:
    """CUTLASS INT8 layers whose K or N is not a multiple of 16: ``cutlass_scaled_mm`` runs
    ``triton_scaled_mm`` there (§1.2 Pitfall 1; FP8 pads weights, INT8 does not)."""
    cutlass_int8 = {"CutlassInt8ScaledMMLinearKernel", "CutlassScaledMMLinearKernel"}
    return sorted(
        name for name, cls in layers.items()
        if cls in cutlass_int8 and name in shapes
        and (shapes[name][0] % ALIGNMENT or shapes[name][1] % ALIGNMENT)
    )


# ---------------------------------------------------------------------------------------------
# run-time call counts (§4 hook options b and c)


def resolve_object(path: str) -> Any:
    """The object at a dotted path: the longest importable module prefix, then attributes
    (``"torch.ops._C"``); None when nothing resolves."""
    parts = path.split(".")
    obj: Any = None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p, None)
            if obj is None:
                return None
        return obj
    return None


def vllm_op_targets(vllm_version: str) -> list[tuple[str, str, str]]:
    """``(object path, attribute, label)`` of the ops to count in ``vllm_version`` (§4).

    * ``torch.ops._C.cutlass_scaled_mm`` -- the CUTLASS op itself (label ``cutlass``);
    * ``vllm._custom_ops.cutlass_scaled_mm`` -- the Python entry, which may fall back to Triton
      (label ``cutlass_entry``; not a family of its own);
    * ``triton_scaled_mm`` in the Triton kernel class's module, where it is imported by name
      (``vllm.model_executor.kernels.linear.scaled_mm.triton`` 0.17+,
      ``...layers.quantization.kernels.scaled_mm.triton`` <= 0.16), and in its defining module,
      which the CUTLASS entry's fallback reaches (label ``triton``);
    * ``torch._scaled_mm`` (label ``torch``, the torch FP8 kernels).
    """
    v = parse_version(vllm_version) or (0, 0, 0)
    kernel_module = (
        "vllm.model_executor.kernels.linear.scaled_mm.triton"
        if v[:2] >= (0, 17)
        else "vllm.model_executor.layers.quantization.kernels.scaled_mm.triton"
    )
    return [
        ("torch.ops._C", "cutlass_scaled_mm", "cutlass"),
        ("vllm._custom_ops", "cutlass_scaled_mm", "cutlass_entry"),
        (kernel_module, "triton_scaled_mm", "triton"),
        (TRITON_SCALED_MM_MODULE, "triton_scaled_mm", "triton"),
        ("torch", "_scaled_mm", "torch"),
    ]


class CallCounter:
    """Counts calls of module attributes by wrapping them while the context is open.

    ``targets`` are ``(object path, attribute, label)``; each ``with counter:`` installs the
    wrappers and removes them on exit (counts accumulate across entries).  A target that does not
    resolve is listed in :attr:`missing`, not an error: the evidence check decides whether the
    missing hook matters.  Patching the attribute is enough because the callers look it up at call
    time (``ops.cutlass_scaled_mm``, ``torch.ops._C.cutlass_scaled_mm``, the module global
    ``triton_scaled_mm``; §4).
    """

    def __init__(self, targets: Iterable[tuple[str, str, str]]) -> None:
        self.targets = list(targets)
        self.counts: dict[str, int] = {}
        self.by_target: dict[str, int] = {}
        self.installed: list[str] = []
        self.missing: list[str] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def _wrap(self, fn: Callable[..., Any], key: str, label: str) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[label] = self.counts.get(label, 0) + 1
            self.by_target[key] = self.by_target.get(key, 0) + 1
            return fn(*args, **kwargs)

        counted.__wrapped__ = fn  # type: ignore[attr-defined]
        return counted

    def __enter__(self) -> CallCounter:
        if self._undo:
            raise RuntimeError("CallCounter is already open")
        self.installed, self.missing = [], []
        for path, attr, label in self.targets:
            key = f"{path}.{attr}"
            obj = resolve_object(path)
            fn = getattr(obj, attr, None) if obj is not None else None
            if fn is None or not callable(fn):
                self.missing.append(key)
                continue
            setattr(obj, attr, self._wrap(fn, key, label))
            self._undo.append((obj, attr, fn))
            self.installed.append(key)
            self.counts.setdefault(label, 0)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            obj, attr, fn = self._undo.pop()
            setattr(obj, attr, fn)

    def reset(self) -> None:
        self.counts = {label: 0 for label in self.counts}
        self.by_target = {}


# ---------------------------------------------------------------------------------------------
# configured versus observed (§1.3, §7.2)


def check_evidence(
    forced: Mapping[str, Any],
    *,
    log_pairs: Sequence[tuple[str, str]] | None,
    layers: Mapping[str, str],
    layer_calls: Mapping[str, Mapping[str, int]] | None = None,
    op_calls: Mapping[str, int] | None = None,
    hooks_missing: Sequence[str] = (),
    shapes: Mapping[str, tuple[int, int]] | None = None,
    require_log: bool = True,
    attention: str | None = None,
    attention_log: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Compare the forcing (:func:`forcing`) with the three sources of evidence (§1.3, §7.2).

    Args:
        forced: what :func:`forcing` returned for the arm.
        log_pairs: :func:`parse_selection_log` of the engine's log (None: not collected).
        layers: :func:`layer_kernels` of the model.
        layer_calls: ``{layer: {kernel class: calls}}`` counted in ``apply_weights`` (None: no run yet).
        op_calls: :class:`CallCounter` counts by label (``cutlass``, ``triton``, ``torch``, ...).
        hooks_missing: targets the counter could not install.
        shapes: :func:`layer_gemm_shapes`, to name the layers where CUTLASS falls back.
        require_log: a missing selection line is a problem (vLLM logs it once per process with
            ``info_once``, so a second engine in one process sees none).
        attention: the attention backend the arm configured (``LLM(attention_backend=...)``), or None.
        attention_log: :func:`parse_attention_log` of the engine's log (None: not collected).

    Returns:
        ``{"configured", "expected_classes", "expected_op", "log", "layer_kernels" (class ->
        layers), "layer_calls", "op_calls", "predicted_fallbacks", "ok", "problems"}``.
    """
    expected = list(forced["expected_classes"])
    exp_set = set(expected)
    problems: list[str] = []
    log = [list(p) for p in (log_pairs or [])]
    if log_pairs is not None:
        logged = sorted({cls for cls, _ in log_pairs})
        wrong_log = [c for c in logged if c not in exp_set]
        if wrong_log:
            problems.append(f"vLLM logged selecting {', '.join(wrong_log)} (expected {' or '.join(expected)})")
        elif not logged and require_log:
            problems.append(
                f"no '{forced.get('log_verb', 'Selected')} ... for ...' kernel-selection line in vLLM's log "
                "(§1.3; was the log level above INFO?)"
            )
    by_class: dict[str, int] = {}
    for cls in layers.values():
        by_class[cls] = by_class.get(cls, 0) + 1
    if not layers:
        problems.append("no quantized linear layer found (no module with scheme.kernel, §1.3)")
    wrong_layers = sorted(n for n, c in layers.items() if c not in exp_set)
    if wrong_layers:
        problems.append(
            f"{len(wrong_layers)} of {len(layers)} layers selected another kernel class "
            f"(e.g. {wrong_layers[0]}: {layers[wrong_layers[0]]}; expected {' or '.join(expected)})"
        )
    fallbacks = predicted_fallbacks(layers, shapes or {})
    if layer_calls is not None:
        calls = {n: dict(c) for n, c in layer_calls.items()}
        if len(exp_set) == 1:
            _, ok, problem = kernel_evidence(calls, expected[0])
            if not ok and problem:
                problems.append(f"apply_weights calls: {problem}")
        else:
            ran = sorted({c for per in calls.values() for c, n in per.items() if n > 0})
            silent = sorted(n for n, per in calls.items() if not any(per.values()))
            if silent:
                problems.append(f"apply_weights calls: {len(silent)} layers never ran (e.g. {silent[0]})")
            if not set(ran) <= exp_set:
                problems.append(f"apply_weights calls: layers ran {ran}, expected {' or '.join(expected)}")
    op = forced["expected_op"]
    if op_calls is not None:
        missing_op = [h for h in hooks_missing if _label_of(h) == op]
        if missing_op and not op_calls.get(op):
            problems.append(f"could not count calls of the {op} op (hooks missing: {', '.join(missing_op)})")
        families = {k: int(v) for k, v in op_calls.items() if k in ("cutlass", "triton", "torch")}
        _, ok, problem = kernel_evidence({"ops": families}, op)
        if not ok:
            text = f"run-time op calls {families}: {problem}"
            if op == "cutlass" and families.get("triton"):
                where = f" in {len(fallbacks)} layers (e.g. {fallbacks[0]})" if fallbacks else ""
                text += (f"; K or N not a multiple of {ALIGNMENT}{where} makes cutlass_scaled_mm run "
                         "triton_scaled_mm (§1.2 Pitfall 1)")
            problems.append(text)
    problems += attention_problems(attention, attention_log, require_log)
    return {
        "configured": forced["family"],
        "attention": {"configured": attention, "observed": None if attention_log is None else list(attention_log)},
        "vllm": forced.get("vllm"),
        "expected_classes": expected,
        "expected_op": op,
        "log": log,
        "layer_kernels": by_class,
        "layer_calls": None if layer_calls is None else {n: dict(c) for n, c in layer_calls.items()},
        "op_calls": None if op_calls is None else dict(op_calls),
        "hooks_missing": list(hooks_missing),
        "predicted_fallbacks": fallbacks,
        "ok": not problems,
        "problems": problems,
    }


def _label_of(hook: str) -> str:
    if hook.endswith("triton_scaled_mm"):
        return "triton"
    if hook == "torch.ops._C.cutlass_scaled_mm":
        return "cutlass"
    if hook == "torch._scaled_mm":
        return "torch"
    return "other"


def require_evidence(evidence: Mapping[str, Any]) -> Mapping[str, Any]:
    """``evidence`` if it is ok, else :class:`KernelEvidenceError` naming every problem."""
    if not evidence["ok"]:
        raise KernelEvidenceError(
            f"kernel-selection evidence does not match the configured kernel {evidence['configured']!r} "
            f"(vLLM {evidence.get('vllm')}): " + "; ".join(evidence["problems"])
            + ". A run that did not test what it claims must not count."
        )
    return evidence
