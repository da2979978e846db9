"""``swapcheck model``: the shipped models (docs/models.md), and their compressed-tensors export for vLLM."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.common import FormatOpt, TableFormat, emit_rows, user_errors
from orchestrator.errors import UsageError

app = typer.Typer(help="Shipped models: list them, export one as a compressed-tensors W8A8 checkpoint for vLLM.",
                  no_args_is_help=True)


@app.command("list")
def list_(fmt: FormatOpt = TableFormat.table) -> None:
    """Show each shipped model (models/<name>): its weights' sha256 (checked), parameters and held-out accuracy.

    Example: swapcheck model list
    """
    with user_errors():
        import json

        from tasks.models.checkpoint import SHIPPED_MODELS, check_manifest, shipped_model_dir

        rows = []
        for name in SHIPPED_MODELS:
            try:
                manifest = check_manifest(shipped_model_dir(name)) or {}
            except ValueError as exc:
                raise UsageError(f"model {name}: {exc}") from None
            held = manifest.get("held_out")
            acc = {k: f"{v['correct']}/{v['n']}" for k, v in held.items()} if isinstance(held, dict) else {}
            rows.append({"name": name, "sha256": manifest.get("model_safetensors_sha256", ""),
                         "parameters": manifest.get("parameters"), "steps": manifest.get("steps"),
                         "held-out right": json.dumps(acc) if fmt is not TableFormat.json else acc})
        emit_rows(rows, fmt, title="shipped models")


@app.command("export")
def export(
    name: str = typer.Argument(..., help="A shipped model (swapcheck model list)."),
    out_dir: Path = typer.Option(..., "--out", help="Directory to write; must not exist or be empty."),
    fmt: FormatOpt = TableFormat.table,
) -> None:
    """Write a shipped model as a compressed-tensors W8A8 INT8 checkpoint directory, what a vLLM arm runs.

    The int8 weights and per-channel scales are those the CPU engine quantizes on load (real
    scales), so `build_model(DIR)` gives bit-identical logits to `build_model(NAME)`. MANIFEST.json
    records the source model, its sha256 (checked before export) and the sha256 of each written
    file; loading the directory checks model.safetensors against it. A vLLM arm whose `model` is a
    shipped name exports into the model cache on its own ($SWAPCHECK_MODEL_CACHE, default
    ~/.cache/swapcheck/models); this command is for using the checkpoint elsewhere.

    Example: swapcheck model export answer-qwen3 --out checkpoints/answer-qwen3-w8a8
    """
    with user_errors():
        from tasks.models.checkpoint import SHIPPED_MODELS
        from tasks.models.export import export_compressed

        if name not in SHIPPED_MODELS:
            raise UsageError(f"model {name!r} is not a shipped model; allowed: {', '.join(SHIPPED_MODELS)}")
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise UsageError(f"--out {out_dir}: exists and is not an empty directory; give a new directory")
        try:
            manifest = export_compressed(name, out_dir)
        except ValueError as exc:  # the shipped weights' sha256 differs from their MANIFEST.json
            raise UsageError(f"model {name}: {exc}") from None
        if fmt is TableFormat.json:
            import json
            import sys

            sys.stdout.write(json.dumps({"out": str(out_dir), **manifest}, indent=1) + "\n")
            return
        rows = [{"file": f, "sha256": h} for f, h in manifest["files"].items()]
        emit_rows(rows, fmt, title=f"{out_dir}: {manifest['name']} from {name} "
                                   f"(sha256 {manifest['source']['model_safetensors_sha256'][:16]}...)")


@app.command("quantize")
def quantize(
    src: Path = typer.Option(..., "--from", help="A local float Hugging Face checkpoint directory (Qwen3 or Llama)."),
    out_dir: Path = typer.Option(..., "--out", help="Directory to write; must not exist or be empty."),
    fmt: FormatOpt = TableFormat.table,
) -> None:
    """Turn a local float checkpoint into the compressed-tensors W8A8 INT8 checkpoint vLLM 0.32 loads.

    Weights: int8, symmetric, one scale per output channel (fl(absmax / 127)); activations: dynamic
    per token -- what the CPU engine computes from the same float weights on load, so the written
    checkpoint's logits on the CPU engine equal those of the float checkpoint quantized in memory,
    bit for bit. config.json names the causal-LM class (vLLM picks the model from it) and carries the
    quantization_config; MANIFEST.json records the sha256 of every source and written file. No hub:
    the source is a directory on disk (a real checkpoint on the cluster's storage).

    Example: swapcheck model quantize --from /ckpt/Qwen3-1.7B --out /ckpt/Qwen3-1.7B-w8a8
    """
    with user_errors():
        from tasks.models.export import quantize_checkpoint

        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise UsageError(f"--out {out_dir}: exists and is not an empty directory; give a new directory")
        try:
            manifest = quantize_checkpoint(src, out_dir)
        except ValueError as exc:
            raise UsageError(f"--from {src}: {exc}") from None
        if fmt is TableFormat.json:
            import json
            import sys

            sys.stdout.write(json.dumps({"out": str(out_dir), **manifest}, indent=1) + "\n")
            return
        rows = [{"file": f, "sha256": h} for f, h in manifest["files"].items()]
        emit_rows(rows, fmt, title=f"{out_dir}: {manifest['name']} (compressed-tensors W8A8) from {src}")
