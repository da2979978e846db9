"""A shipped model as a compressed-tensors W8A8 INT8 checkpoint directory, what a vLLM arm runs.

* :func:`export_compressed` writes one (``swapcheck model export``) with :func:`~tasks.models.checkpoint.save_compressed`
  and a ``MANIFEST.json`` naming the source model, its sha256 and the written files' sha256;
* :func:`check_export` checks such a directory's files against it;
* :func:`exported_model_dir` keeps one export per shipped model and weights hash in a cache directory
  (``$SWAPCHECK_MODEL_CACHE``, default ``~/.cache/swapcheck/models``), checked on every use: a vLLM
  arm whose ``model`` is a shipped name runs it (tasks/models/arms.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .checkpoint import ManifestError, check_manifest, save_compressed, shipped_model_dir

__all__ = ["EXPORT_FORMAT", "check_export", "export_compressed", "exported_model_dir"]

#: ``MANIFEST.json``'s ``format`` in a directory written by :func:`export_compressed`.
EXPORT_FORMAT = "swapcheck-compressed-export"
#: What an export writes, as a number in the cache's directory names: 2 since config.json names the
#: causal-LM class in ``architectures`` (issue #37: ``null`` made vLLM serve a pooling model).
EXPORT_REVISION = 2


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_compressed(name: str, out: str | Path) -> dict[str, Any]:
    """Write the shipped model ``name`` as a compressed-tensors W8A8 INT8 directory ``out`` (which must
    not exist, or be empty): the int8 weights and per-channel scales the CPU engine quantizes on load
    (real scales), by :func:`save_compressed`, and a ``MANIFEST.json`` with the source model, its
    sha256 (checked first), and the sha256 of each written file; ``model_safetensors_sha256`` makes
    :func:`read_checkpoint` check the written weights on every load.  Written into a sibling
    temporary directory and renamed into place, so ``out`` is complete or absent.  Returns the manifest."""
    from .engine import build_model

    src = shipped_model_dir(name)
    source = check_manifest(src)
    if source is None:
        raise ManifestError(f"{src}: the shipped model {name!r} has no MANIFEST.json")
    return _write_export(build_model(name), out, name=f"{name}-w8a8",
                         source={"model": name, "model_safetensors_sha256": source["model_safetensors_sha256"],
                                 "manifest_sha256": _sha256(src / "MANIFEST.json")},
                         written_by="swapcheck model export (tasks.models.export.export_compressed)")


def _write_export(model: Any, out: str | Path, *, name: str, source: dict[str, Any], written_by: str) -> dict[str, Any]:
    """``model`` as a compressed-tensors directory ``out`` (new or empty) with its MANIFEST.json, written
    into a sibling temporary directory and renamed into place, so ``out`` is complete or absent."""
    import os
    import shutil
    import tempfile

    import torch
    import transformers

    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ValueError(f"{root}: exists and is not an empty directory; give a new directory")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        save_compressed(model, tmp)
        files = {f.name: _sha256(f) for f in sorted(tmp.iterdir())}
        manifest = {
            "format": EXPORT_FORMAT, "version": 1, "name": name, "source": source,
            "model_safetensors_sha256": files["model.safetensors"], "files": files,
            "quantization": "compressed-tensors W8A8 INT8: weights int8 per output channel, symmetric, "
                            "scale fl(absmax / 127) (the CPU engine's real scales); activations dynamic per token",
            "written_by": written_by,
            "torch": torch.__version__, "transformers": transformers.__version__,
        }
        (tmp / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if root.exists():
            root.rmdir()  # empty (checked above)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


#: The families ``swapcheck model quantize`` takes: decoder layers with ``self_attn.{q,k,v,o}_proj`` and
#: ``mlp.{gate,up,down}_proj``, which vLLM 0.32 serves as W8A8 compressed-tensors checkpoints (tested here
#: on tiny checkpoints of each that transformers saved).
QUANTIZE_FAMILIES = ("qwen3", "llama")


def quantize_checkpoint(src: str | Path, out: str | Path) -> dict[str, Any]:
    """Turn a local float Hugging Face checkpoint ``src`` (``config.json`` + ``*.safetensors``, a model
    type of :data:`QUANTIZE_FAMILIES`) into the compressed-tensors W8A8 INT8 checkpoint vLLM 0.32 loads,
    in the directory ``out`` (new, or empty): symmetric per-output-channel int8 weights with scale
    ``fl(absmax / 127)`` and dynamic per-token int8 activations -- the quantization the CPU engine makes
    of the same weights on load, so ``build_model(out)`` computes bit for bit what ``build_model(src)``
    computes. Written as :func:`export_compressed` writes (a sibling temporary directory renamed into
    place), with a ``MANIFEST.json`` holding the sha256 of every source file and of every written one.
    No hub: the checkpoint must be on disk. Raises ``ValueError`` naming what is wrong with ``src``."""
    from .engine import build_model

    root_src = Path(src)
    cfg_path = root_src / "config.json"
    if not root_src.is_dir() or not cfg_path.is_file() or not list(root_src.glob("*.safetensors")):
        raise ValueError(f"{root_src}: not a local checkpoint directory (config.json and *.safetensors)")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("quantization_config") is not None:
        raise ValueError(f"{cfg_path}: already quantized ({cfg['quantization_config'].get('quant_method')}); "
                         "give the float checkpoint")
    if cfg.get("model_type") not in QUANTIZE_FAMILIES:
        raise ValueError(f"{cfg_path}: model_type {cfg.get('model_type')!r}; quantize takes "
                         f"{', '.join(QUANTIZE_FAMILIES)}")
    files = {f.name: _sha256(f) for f in sorted(root_src.iterdir()) if f.suffix in (".json", ".safetensors")}
    source = {"path": str(root_src.resolve()), "model_type": cfg["model_type"], "files": files}
    # build_model reads the checkpoint once, with read_checkpoint's own checks (a tensor in two files, ...)
    return _write_export(build_model(str(root_src)), out, name=f"{root_src.name}-w8a8", source=source,
                         written_by="swapcheck model quantize (tasks.models.export.quantize_checkpoint)")


def check_export(root: Path, name: str | None = None) -> dict[str, Any]:
    """The manifest of the export directory ``root`` after checking every file it lists against its
    sha256 (and, given ``name``, that it was written from the shipped ``name``'s present weights)."""
    manifest = check_manifest(root)
    if manifest is None or manifest.get("format") != EXPORT_FORMAT:
        raise ManifestError(f"{root}: not a directory written by `swapcheck model export` (no {EXPORT_FORMAT} "
                            "MANIFEST.json)")
    for fname, want in manifest["files"].items():
        f = root / fname
        if not f.is_file() or _sha256(f) != want:
            raise ManifestError(f"{f}: missing or its sha256 differs from MANIFEST.json's {want}; remove {root} "
                                "to export again")
    if name is not None:
        want = check_manifest(shipped_model_dir(name))
        if want is None or manifest["source"]["model_safetensors_sha256"] != want["model_safetensors_sha256"]:
            raise ManifestError(f"{root}: exported from other weights than the shipped {name!r}; remove it to "
                                "export again")
    return manifest


def exported_model_dir(name: str, cache: str | Path | None = None) -> Path:
    """The compressed-tensors export of the shipped model ``name`` in the cache directory (``cache``,
    else ``$SWAPCHECK_MODEL_CACHE``, else ``~/.cache/swapcheck/models``), as
    ``<name>@<first 16 hex of its weights' sha256>-w8a8-r<EXPORT_REVISION>``: written on first use, checked on every use
    (:func:`check_export`).  Two processes exporting at once both write complete copies and one rename
    wins (the other's identical export is discarded)."""
    import os
    import shutil

    src = check_manifest(shipped_model_dir(name))
    if src is None:
        raise ManifestError(f"the shipped model {name!r} has no MANIFEST.json")
    base = Path(cache or os.environ.get("SWAPCHECK_MODEL_CACHE") or Path.home() / ".cache" / "swapcheck" / "models")
    # r2: config.json names the causal-LM class (issue #37); an r1 export in the cache is not reused
    root = base / f"{name}@{str(src['model_safetensors_sha256'])[:16]}-w8a8-r{EXPORT_REVISION}"
    if not root.exists():
        staging = base / f".{root.name}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        export_compressed(name, staging)
        try:
            os.rename(staging, root)
        except OSError:  # another process put its export there first
            shutil.rmtree(staging, ignore_errors=True)
    check_export(root, name)
    return root
