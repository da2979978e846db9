"""The CPU W8A8 engine and operand capture (docs/models.md).

::

    from tasks.models import build_model, save_capture, load_capture

    model = build_model("tiny-qwen3", kernel="int8-cutlass-order", scales="real", seed=0)
    gen = model.generate([[5, 17, 3], [9, 4]], max_new_tokens=32)      # greedy, left-padded
    sc = model.score(gen.sequences())                                  # teacher-forced
    with model.capture() as cap:
        model.forward_tokens([[5, 17, 3], [9, 4]])
    save_capture(cap, "unit.safetensors")
    for layer in load_capture("unit.safetensors"):
        assert layer.replay().equal(layer.output)                      # bit for bit

Modules: :mod:`.quantization` (vLLM's per-token activation quantizer, per-channel weights,
power-of-two scales), :mod:`.linear` (``W8A8Linear``), :mod:`.checkpoint` (the seeded
``tiny-qwen3``, checkpoint reading, compressed-tensors writing), :mod:`.engine` (``build_model``,
``W8A8Model``), :mod:`.predictions` (generation and scoring results), :mod:`.capture` (captured
operands and their safetensors file).  ``transformers`` is imported only when a model is built.
"""

from .capture import (
    Capture,
    CapturedLayer,
    capture_manifest,
    load_capture,
    read_capture_meta,
    save_capture,
)
from .checkpoint import (
    TINY_QWEN3,
    read_checkpoint,
    save_compressed,
    tiny_qwen3_config,
    tiny_qwen3_float,
)
from .engine import TINY_MODEL, W8A8Model, build_model
from .linear import LAYER_TYPES, PROJECTIONS, W8A8Linear, resolve_kernel
from .predictions import GenerationResult, ScoreResult, sequence_hash
from .quantization import (
    SCALE_MODES,
    is_pow2,
    pow2_up,
    quantize_activations,
    quantize_weight,
    requantize_weight_pow2,
)

__all__ = [
    "Capture",
    "CapturedLayer",
    "GenerationResult",
    "LAYER_TYPES",
    "PROJECTIONS",
    "SCALE_MODES",
    "ScoreResult",
    "TINY_MODEL",
    "TINY_QWEN3",
    "W8A8Linear",
    "W8A8Model",
    "build_model",
    "capture_manifest",
    "is_pow2",
    "load_capture",
    "pow2_up",
    "quantize_activations",
    "quantize_weight",
    "read_capture_meta",
    "read_checkpoint",
    "requantize_weight_pow2",
    "resolve_kernel",
    "save_capture",
    "save_compressed",
    "sequence_hash",
    "tiny_qwen3_config",
    "tiny_qwen3_float",
]
