"""Where the engine's weights come from: the seeded ``tiny-qwen3`` model or a local checkpoint.

* :func:`tiny_qwen3_float` builds the float32 ``tiny-qwen3`` (a ``transformers``
  ``Qwen3ForCausalLM``; config :data:`TINY_QWEN3`) with weights drawn deterministically from the
  seed: every parameter from its own ``torch.Generator`` seeded by ``sha256(("tiny-qwen3", seed,
  parameter name))``, so the weights depend on the seed and the name only (not on the global RNG,
  the parameter order or the transformers version's own init).
* :func:`read_checkpoint` reads a local checkpoint directory: ``config.json`` plus every
  ``*.safetensors`` file in it.  A ``quantization_config`` with ``quant_method ==
  "compressed-tensors"`` is checked to be W8A8 INT8 (8-bit symmetric int weights per channel or
  per tensor; 8-bit symmetric dynamic per-token int activations) and its int8 ``weight`` +
  ``weight_scale`` tensors are used as they are.  Anything else with a ``quantization_config`` is
  refused; a checkpoint without one is a plain float checkpoint, quantized on load.
* :func:`save_compressed` writes a :class:`~tasks.models.W8A8Model` as a compressed-tensors W8A8
  INT8 checkpoint (``config.json`` with ``quantization_config``, ``model.safetensors`` with int8
  ``weight`` ``[N, K]`` and fp32 ``weight_scale`` ``[N, 1]`` per decoder linear, everything else
  in fp32), which :func:`read_checkpoint` loads back bit for bit.
* Shipped checkpoints (:data:`SHIPPED_MODELS`: ``answer-qwen3``, a Qwen3 trained by
  ``tools/train_answer_model.py``) live in the repository's ``models/<name>`` and load by name;
  a checkpoint directory with a ``MANIFEST.json`` that records ``model_safetensors_sha256`` is
  loaded only if ``model.safetensors`` has that hash (:func:`check_manifest`).
* A shipped model written as a compressed-tensors directory for vLLM (``swapcheck model export``,
  the model cache of vLLM arms): :mod:`tasks.models.export`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tasks.seeds import stable_seed

if TYPE_CHECKING:
    from .engine import W8A8Model

__all__ = [
    "TINY_QWEN3",
    "INIT_STD",
    "Checkpoint",
    "tiny_qwen3_config",
    "tiny_qwen3_float",
    "read_checkpoint",
    "save_compressed",
    "COMPRESSED_TENSORS_W8A8",
    "SHIPPED_MODELS",
    "ManifestError",
    "check_manifest",
    "shipped_model_dir",
]

#: Checkpoints shipped in the repository's ``models/`` directory, loaded by name.
SHIPPED_MODELS = ("answer-qwen3",)
#: Where they live: ``<repository>/models/<name>``.
#: The shipped checkpoints: package data of ``tasks.models`` (issue #37: a ``models/`` directory at the
#: repository root was missing from every installed wheel, so ``answer-qwen3`` worked from a checkout only).
MODELS_DIR = Path(__file__).resolve().parent / "shipped"


class ManifestError(ValueError):
    """A checkpoint's ``model.safetensors`` does not have the sha256 its ``MANIFEST.json`` records."""


def shipped_model_dir(name: str) -> Path:
    """The directory of the shipped checkpoint ``name`` (one of :data:`SHIPPED_MODELS`)."""
    if name not in SHIPPED_MODELS:
        raise ValueError(f"model {name!r} is not a shipped model; allowed: {', '.join(SHIPPED_MODELS)}")
    root = MODELS_DIR / name
    if not (root / "config.json").is_file():
        raise ValueError(f"model {name!r}: the shipped checkpoint {root} is missing (config.json not found)")
    return root


def check_manifest(path: str | Path) -> dict[str, Any] | None:
    """Check ``model.safetensors`` of the directory ``path`` against its ``MANIFEST.json``.

    Returns the manifest, or None when the directory has none (an ordinary checkpoint).  Raises
    :class:`ManifestError` when the file's sha256 differs from ``model_safetensors_sha256`` (or
    the manifest records none, or the file is missing)."""
    root = Path(path)
    mf = root / "MANIFEST.json"
    if not mf.is_file():
        return None
    try:
        manifest: dict[str, Any] = json.loads(mf.read_text())
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{mf}: not valid JSON ({exc})") from exc
    want = manifest.get("model_safetensors_sha256") if isinstance(manifest, dict) else None
    if not isinstance(want, str) or len(want) != 64:
        raise ManifestError(f"{mf}: model_safetensors_sha256 is missing or not a sha256 hex digest")
    weights = root / "model.safetensors"
    if not weights.is_file():
        raise ManifestError(f"{root}: model.safetensors is missing (MANIFEST.json records sha256 {want})")
    got = hashlib.sha256(weights.read_bytes()).hexdigest()
    if got != want:
        raise ManifestError(
            f"{weights}: sha256 {got} does not match MANIFEST.json's model_safetensors_sha256 {want}; "
            "the weights were changed or damaged (retrain with the manifest's command, or restore the file)"
        )
    return manifest

#: The ``tiny-qwen3`` architecture (transformers ``Qwen3Config`` keyword arguments).  4 decoder
#: layers x 7 linears = 28 W8A8 layers.
TINY_QWEN3: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "attention_bias": False,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "use_sliding_window": False,
}

#: Standard deviations of the seeded init, by parameter kind.  Norm weights are ``1 + std * z``.
INIT_STD = {"embed": 1.0, "linear": 0.08, "lm_head": 0.1, "norm": 0.1}

#: The ``quantization_config`` :func:`save_compressed` writes (llm-compressor's W8A8 INT8 scheme).
COMPRESSED_TENSORS_W8A8: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}


def tiny_qwen3_config(**overrides: Any) -> Any:
    """The ``tiny-qwen3`` ``Qwen3Config`` (:data:`TINY_QWEN3`, updated by ``overrides``)."""
    from transformers import Qwen3Config

    unknown = sorted(set(overrides) - set(Qwen3Config().to_dict()))
    if unknown:
        raise ValueError(f"unknown Qwen3Config field(s) in overrides: {', '.join(unknown)}")
    return Qwen3Config(**{**TINY_QWEN3, **overrides})


def _build_float(config: Any, reductions: str = "fp64") -> Any:
    """A float32 causal LM for ``config``; ``reductions`` "fp64" (attention and lm_head in float64,
    :mod:`.invariance`; default) or "fp32" (transformers' own).  The global RNG is left untouched."""
    from transformers import AutoModelForCausalLM

    from . import invariance

    if reductions not in invariance.REDUCTIONS:
        raise ValueError(f"reductions must be one of {', '.join(invariance.REDUCTIONS)}; got {reductions!r}")
    invariance.register()
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=invariance.REDUCTIONS[reductions], dtype=torch.float32
        )
    invariance.apply(model, reductions)
    return model.eval()


def _init_kind(name: str) -> str:
    if name.endswith("norm.weight"):
        return "norm"
    if "embed_tokens" in name:
        return "embed"
    if name.startswith("lm_head"):
        return "lm_head"
    return "linear"


def tiny_qwen3_float(seed: int = 0, reductions: str = "fp64", **overrides: Any) -> Any:
    """The float32 ``tiny-qwen3`` ``Qwen3ForCausalLM`` with seeded weights (module docstring).

    Linear weights and biases ~ N(0, 0.08²), embeddings ~ N(0, 1), lm_head ~ N(0, 0.1²), RMSNorm
    weights ~ 1 + N(0, 0.1²) (:data:`INIT_STD`).  ``reductions``: see :mod:`.invariance`.
    """
    model = _build_float(tiny_qwen3_config(**overrides), reductions)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            g = torch.Generator().manual_seed(stable_seed("tiny-qwen3", seed, name))
            kind = _init_kind(name)
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(1.0 + INIT_STD[kind] * z if kind == "norm" else INIT_STD[kind] * z)
    return model


@dataclass
class Checkpoint:
    """A checkpoint read from disk: ``config`` (transformers config, ``quantization_config``
    removed), ``tensors`` (name -> tensor, every safetensors file merged), ``quantized`` (a
    compressed-tensors W8A8 INT8 checkpoint?), ``path`` and ``notes``."""

    path: Path
    config: Any
    tensors: dict[str, torch.Tensor]
    quantized: bool
    quantization_config: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def _check_compressed_tensors(qc: dict[str, Any], where: Path) -> None:
    def bad(msg: str) -> ValueError:
        return ValueError(f"{where / 'config.json'}: quantization_config: {msg}")

    if qc.get("quant_method") != "compressed-tensors":
        raise bad(
            f"quant_method {qc.get('quant_method')!r} is not supported; allowed: 'compressed-tensors' "
            "(W8A8 INT8), or no quantization_config (a float checkpoint, quantized on load)"
        )
    fmt = qc.get("format")
    if fmt not in (None, "int-quantized", "naive-quantized"):
        raise bad(f"format {fmt!r} is not supported; allowed: 'int-quantized', 'naive-quantized'")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise bad("config_groups is empty; a W8A8 INT8 scheme is required")
    for gname, group in groups.items():
        w = group.get("weights") or {}
        a = group.get("input_activations")
        path = f"config_groups.{gname}"
        if w.get("num_bits") != 8 or w.get("type", "int") != "int" or not w.get("symmetric", True):
            raise bad(f"{path}.weights must be 8-bit symmetric int, got {w}")
        if w.get("strategy") not in ("channel", "tensor"):
            raise bad(f"{path}.weights.strategy must be 'channel' or 'tensor', got {w.get('strategy')!r}")
        if not a:
            raise bad(f"{path}.input_activations is missing: only W8A8 (int8 activations) is supported")
        if a.get("num_bits") != 8 or a.get("type", "int") != "int" or not a.get("symmetric", True):
            raise bad(f"{path}.input_activations must be 8-bit symmetric int, got {a}")
        if not a.get("dynamic") or a.get("strategy") != "token":
            raise bad(
                f"{path}.input_activations must be dynamic per-token (strategy 'token', dynamic true); "
                f"got strategy {a.get('strategy')!r}, dynamic {a.get('dynamic')!r}"
            )


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read ``config.json`` and every ``*.safetensors`` of the directory ``path`` (module docstring)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    root = Path(path)
    if not root.is_dir():
        raise ValueError(
            f"model {str(path)!r} is neither 'tiny-qwen3' nor a checkpoint directory (a directory with "
            f"config.json and *.safetensors) nor a shipped model ({', '.join(SHIPPED_MODELS)})"
        )
    check_manifest(root)
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{root}: no config.json (a checkpoint directory needs config.json and *.safetensors)")
    cfg = json.loads(cfg_path.read_text())
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{root}: no *.safetensors files")
    qc = cfg.pop("quantization_config", None)
    if qc is not None:
        _check_compressed_tensors(qc, root)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise ValueError(f"{cfg_path}: model_type is missing")
    for key in ("transformers_version", "_name_or_path", "architectures"):
        cfg.pop(key, None)
    config = AutoConfig.for_model(model_type, **cfg)
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            if name in tensors:
                raise ValueError(f"{root}: tensor {name!r} appears in more than one safetensors file")
            tensors[name] = t
    return Checkpoint(root, config, tensors, qc is not None, qc)


def causal_lm_architecture(model_type: str | None) -> str:
    """The causal-LM class transformers maps ``model_type`` to (``qwen3`` -> ``Qwen3ForCausalLM``), which
    a checkpoint's ``config.json`` must name in ``architectures``: vLLM picks the model class from it,
    and with ``null`` there (what ``save_compressed`` wrote before issue #37) vLLM 0.32 falls back to
    transformers' *base* model (``Qwen3Model``), which it serves as a pooling model, so
    ``LLM.generate`` refuses it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(model_type))
    if name is None:
        raise ValueError(f"model_type {model_type!r} has no causal-LM class in transformers")
    return str(name)


def save_compressed(model: W8A8Model, path: str | Path) -> Path:
    """Write ``model`` as a compressed-tensors W8A8 INT8 checkpoint directory (module docstring)."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    linears = model.linears()
    prefixes = {f"model.{name}." for name in linears}
    tensors: dict[str, torch.Tensor] = {}
    for name, t in model.hf.state_dict().items():
        if any(name.startswith(p) for p in prefixes):
            continue
        tensors[name] = t.detach().to(torch.float32).contiguous().clone()
    for name, lin in linears.items():
        tensors[f"model.{name}.weight"] = lin.weight.contiguous().clone()
        tensors[f"model.{name}.weight_scale"] = lin.weight_scale.reshape(-1, 1).contiguous().clone()
        if lin.bias is not None:
            tensors[f"model.{name}.bias"] = lin.bias.to(torch.float32).contiguous().clone()
    if model.hf.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.hf.config.to_dict()
    cfg["architectures"] = [causal_lm_architecture(cfg.get("model_type"))]
    cfg["quantization_config"] = json.loads(json.dumps(COMPRESSED_TENSORS_W8A8))
    cfg.pop("_attn_implementation_autoset", None)
    (root / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
    return root
