"""The culprit replay artifact: the operands of the linear(s) that make two kernels' generations part,
saved self-contained so that both kernels can be re-run on them anywhere (format
``swapcheck.localize-culprit``).

One ``.safetensors`` file; per culprit linear ``<name>`` (``layers.1.mlp.down_proj``):

==================  ==========================================================================
tensor              what it is
==================  ==========================================================================
``<name>/x_q``      int8 ``[M, K]``: the per-token quantized input the linear received
``<name>/x_scale``  float32 ``[M, 1]``: its per-token scales
``<name>/w_q``      int8 ``[N, K]``: the linear's weights (the kernel gets ``w_q.t()``, ``[K, N]``)
``<name>/w_scale``  float32 ``[N]``: the per-channel weight scales
``<name>/bias``     ``[N]`` in the output dtype; absent when the linear has none
``<name>/out_a``    ``[M, N]`` output dtype: kernel A's output on exactly these operands
``<name>/out_b``    the same for kernel B
==================  ==========================================================================

The operands are those of the reference (all-A) forward pass over the prompt and the reference
tokens before the first divergence: row ``r`` is sequence position ``r``, and the last row is the
step that chose the diverging token.  The safetensors metadata entry ``swapcheck`` holds JSON:
``format`` ("swapcheck.localize-culprit"), ``format_version`` (1), ``kernel_a`` / ``kernel_b``
(``name`` as the spec named the arm, registry ``kernel``, ``params``, ``version``), ``out_dtype``,
``model`` (the engine's identity: model, weights sha256, scales, seed, ...), ``prompt_index``,
``prompt``, ``prefix`` (the token ids the pass read), ``first_divergence``, ``culprit`` (the
linear names) and ``linears``: per linear ``name``, ``m``/``n``/``k``, ``has_bias``, ``sha256_a`` /
``sha256_b`` (of the outputs' bytes), ``differing`` (elements whose bits differ) and
``first_difference`` (row-major first differing element: ``row``, ``col``, ``a``, ``b`` as floats and
``bits_a``/``bits_b`` as hex), or null when both kernels agree on that linear's operands, and
``operands_from``: ``"all-A"`` (the reference pass above), or ``"culprit-on-B"`` for a linear on whose
all-A operands both kernels agree -- it differs only once an upstream member of the culprit set has
changed its input -- whose operands then come from the same pass with the culprit set on kernel B.

:func:`replay_culprit` re-runs both kernels (by the registry names and parameters recorded) and
says whether both outputs reproduce byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swapcheck_common.errors import InputError

if TYPE_CHECKING:
    import torch

    from .capture import CapturedLayer

__all__ = ["FORMAT", "FORMAT_VERSION", "CulpritArtifactError", "CulpritReplay", "culprit_bytes", "is_culprit_artifact",
           "linear_entry", "load_culprit", "outputs_differ", "replay_culprit"]

FORMAT = "swapcheck.localize-culprit"
FORMAT_VERSION = 1
_META_KEY = "swapcheck"


class CulpritArtifactError(InputError):
    """A file that is not a readable culprit artifact: the message names the file and the field."""


def _bytes(t: torch.Tensor) -> bytes:
    import torch

    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(_bytes(t)).hexdigest()


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[int, dict[str, Any] | None]:
    """How many elements differ bit for bit, and the first (row-major) with its values and bits."""
    import torch

    width = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    ia, ib = a.contiguous().view(width), b.contiguous().view(width)
    diff = (ia != ib)
    count = int(diff.sum().item())
    if count == 0:
        return 0, None
    flat = int(torch.nonzero(diff.reshape(-1))[0].item())
    row, col = divmod(flat, int(a.shape[1]))
    bits = 2 * a.element_size()
    mask = (1 << (8 * a.element_size())) - 1
    return count, {"row": row, "col": col, "a": float(a[row, col].item()), "b": float(b[row, col].item()),
                   "bits_a": f"0x{int(ia[row, col].item()) & mask:0{bits}x}",
                   "bits_b": f"0x{int(ib[row, col].item()) & mask:0{bits}x}"}


def _kernel(entry: dict[str, Any]) -> Any:
    from tasks.kernels import get_kernel

    return get_kernel(entry["kernel"], **entry["params"])


def outputs_differ(layer: CapturedLayer, kernel_a: dict[str, Any], kernel_b: dict[str, Any]) -> bool:
    """Whether the two kernels' outputs on one captured call differ in any bit."""
    ops = layer.operands()
    return _bytes(_kernel(kernel_a)(*ops)) != _bytes(_kernel(kernel_b)(*ops))


def linear_entry(layer: CapturedLayer, kernel_a: dict[str, Any], kernel_b: dict[str, Any]
                 ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Both kernels on one captured call: the tensors (keys ``<name>/...``) and the metadata entry."""
    ka, kb = _kernel(kernel_a), _kernel(kernel_b)
    ops = layer.operands()
    out_a, out_b = ka(*ops), kb(*ops)
    differing, first = _first_difference(out_a, out_b)
    n = layer.name
    tensors = {f"{n}/x_q": layer.x_q, f"{n}/x_scale": layer.x_scale, f"{n}/w_q": layer.w_q,
               f"{n}/w_scale": layer.w_scale, f"{n}/out_a": out_a, f"{n}/out_b": out_b}
    if layer.bias is not None:
        tensors[f"{n}/bias"] = layer.bias
    meta = {"name": n, "m": layer.m, "n": layer.n, "k": layer.k, "has_bias": layer.bias is not None,
            "out_dtype": str(out_a.dtype).removeprefix("torch."), "sha256_a": _sha(out_a), "sha256_b": _sha(out_b),
            "differing": differing, "first_difference": first,
            "operands_from": getattr(layer, "operands_from", "all-A")}
    return tensors, meta


def culprit_bytes(layers: list[CapturedLayer], kernel_a: dict[str, Any], kernel_b: dict[str, Any],
                  info: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The artifact's bytes for the captured calls of the culprit linears, and its metadata.

    ``kernel_a`` / ``kernel_b``: ``{"name", "kernel", "params", "version"}``; ``info``: the rest of the
    metadata (model, prompt_index, prompt, prefix, first_divergence, culprit).
    """
    from safetensors.torch import save

    if not layers:
        raise ValueError("a culprit artifact needs at least one captured linear")
    tensors: dict[str, torch.Tensor] = {}
    entries = []
    for layer in layers:
        t, m = linear_entry(layer, kernel_a, kernel_b)
        tensors.update({k: v.contiguous().clone() for k, v in t.items()})
        entries.append(m)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "kernel_a": kernel_a, "kernel_b": kernel_b,
            "out_dtype": entries[0]["out_dtype"], **info, "linears": entries}
    return save(tensors, metadata={_META_KEY: json.dumps(meta, sort_keys=True, default=str)}), meta


def _header(path: Path) -> tuple[dict[str, Any] | None, str]:
    from safetensors import safe_open

    where = str(path)
    if not path.is_file():
        raise CulpritArtifactError(f"{where}: no such file")
    try:
        with safe_open(where, framework="pt") as f:
            raw = (f.metadata() or {}).get(_META_KEY)
    except Exception as exc:  # safetensors raises its own errors for a bad header
        raise CulpritArtifactError(f"{where}: not a safetensors file ({type(exc).__name__}: {exc})") from exc
    if raw is None:
        return None, where
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CulpritArtifactError(f"{where}: metadata.swapcheck: not JSON ({exc})") from exc
    return (meta if isinstance(meta, dict) else None), where


def is_culprit_artifact(path: str | Path) -> bool:
    """Whether ``path`` is a safetensors file whose metadata says ``format`` = localize-culprit
    (False for anything else, a fuzz artifact included; never raises for a readable file)."""
    try:
        meta, _ = _header(Path(path))
    except CulpritArtifactError:
        return False
    return meta is not None and meta.get("format") == FORMAT


def load_culprit(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The artifact's metadata and tensors, validated (:class:`CulpritArtifactError` names the field)."""
    from safetensors.torch import load_file

    meta, where = _header(Path(path))
    if meta is None:
        raise CulpritArtifactError(f"{where}: metadata.swapcheck: missing (not a swapcheck culprit artifact)")
    if meta.get("format") != FORMAT:
        raise CulpritArtifactError(f"{where}: format: expected {FORMAT!r}, got {meta.get('format')!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CulpritArtifactError(f"{where}: format_version: this swapcheck reads {FORMAT_VERSION}, "
                                   f"got {meta.get('format_version')!r}")
    for side in ("kernel_a", "kernel_b"):
        k = meta.get(side)
        if not isinstance(k, dict) or not isinstance(k.get("kernel"), str) or not isinstance(k.get("params"), dict):
            raise CulpritArtifactError(f"{where}: {side}: expected an object with a kernel name and params")
    linears = meta.get("linears")
    if not isinstance(linears, list) or not linears:
        raise CulpritArtifactError(f"{where}: linears: expected a non-empty list")
    tensors = load_file(where)
    for i, lin in enumerate(linears):
        if not isinstance(lin, dict) or not isinstance(lin.get("name"), str):
            raise CulpritArtifactError(f"{where}: linears[{i}].name: missing")
        for part in ("x_q", "x_scale", "w_q", "w_scale", "out_a", "out_b"):
            if f"{lin['name']}/{part}" not in tensors:
                raise CulpritArtifactError(f"{where}: tensors.{lin['name']}/{part}: missing")
        for side in ("sha256_a", "sha256_b"):
            if not isinstance(lin.get(side), str):
                raise CulpritArtifactError(f"{where}: linears[{i}].{side}: missing")
    return meta, tensors


@dataclass
class LinearReplay:
    """One culprit linear re-run: whether each kernel's output equals the recorded one byte for byte."""

    name: str
    shape: str
    same_a: bool
    same_b: bool
    differing: int
    recorded_differing: int
    first_difference: dict[str, Any] | None


@dataclass
class CulpritReplay:
    """What :func:`replay_culprit` found."""

    artifact: str
    kernel_a: str
    kernel_b: str
    linears: list[LinearReplay] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        """Both kernels' outputs again, byte for byte, for every culprit linear."""
        return bool(self.linears) and all(x.same_a and x.same_b for x in self.linears)

    def to_json(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "format": FORMAT, "kernel_a": self.kernel_a, "kernel_b": self.kernel_b,
                "reproduced": self.reproduced, "notes": self.notes,
                "linears": [vars(x) for x in self.linears]}

    def text(self) -> str:
        lines = [f"replay of {self.artifact} (culprit artifact: {self.kernel_a} vs {self.kernel_b})", *self.notes]
        for x in self.linears:
            lines.append(f"  {x.name} ({x.shape}): kernel A output "
                         f"{'identical' if x.same_a else 'DIFFERS'}, kernel B output "
                         f"{'identical' if x.same_b else 'DIFFERS'} (byte for byte vs the recorded ones); "
                         f"A and B differ in {x.differing} element(s) (recorded {x.recorded_differing})")
            if x.first_difference is not None:
                f = x.first_difference
                lines.append(f"    first differing element [{f['row']}, {f['col']}]: A {f['a']!r} ({f['bits_a']}), "
                             f"B {f['b']!r} ({f['bits_b']})")
        lines.append("reproduced: both kernels' outputs again, byte for byte" if self.reproduced else
                     "NOT reproduced byte for byte")
        return "\n".join(lines)


def replay_culprit(path: str | Path) -> CulpritReplay:
    """Re-run both recorded kernels on each culprit linear's operands; compare with the recorded outputs.

    Raises:
        CulpritArtifactError: a bad file (the field named); KernelError: a kernel unknown here.
    """
    meta, t = load_culprit(path)
    ka, kb = _kernel(meta["kernel_a"]), _kernel(meta["kernel_b"])
    res = CulpritReplay(str(path), meta["kernel_a"].get("name", meta["kernel_a"]["kernel"]),
                        meta["kernel_b"].get("name", meta["kernel_b"]["kernel"]))
    for side, k in (("kernel_a", ka), ("kernel_b", kb)):
        rec = meta[side].get("version")
        if rec is not None and str(rec) != str(k.version):
            res.notes.append(f"  note: {side} {meta[side]['kernel']} is version {k.version} now; recorded {rec}")
    for lin in meta["linears"]:
        n = lin["name"]
        ops = (t[f"{n}/x_q"], t[f"{n}/w_q"].t(), t[f"{n}/x_scale"], t[f"{n}/w_scale"], t[f"{n}/out_a"].dtype,
               t.get(f"{n}/bias"))
        out_a, out_b = ka(*ops), kb(*ops)

        def same(out: torch.Tensor, rec: torch.Tensor, sha: str) -> bool:
            return out.dtype == rec.dtype and out.shape == rec.shape and _bytes(out) == _bytes(rec) and _sha(out) == sha

        differing, first = _first_difference(out_a, out_b)
        res.linears.append(LinearReplay(
            n, f"{lin.get('m')}x{lin.get('k')}x{lin.get('n')}", same(out_a, t[f"{n}/out_a"], lin["sha256_a"]),
            same(out_b, t[f"{n}/out_b"], lin["sha256_b"]), differing, int(lin.get("differing", -1)), first))
    return res
