"""Fuzz failures as self-contained, replayable artifacts (safetensors + JSON metadata).

One ``.safetensors`` file holds everything a replay needs:

==============  ==============================================================================
tensor          what it is
==============  ==============================================================================
``a``, ``b``    the operands ``[M, K]`` and ``[K, N]``, in the kernel's operand dtype, stored
                contiguous (row-major); ``layout`` says the memory layout the kernel got them in
``scale_a``     (scaled kernels) ``[M or 1, 1]`` float32; ``scale_b``: ``[N or 1]`` float32
``expected``    float64 ``[M, N]``: what a correct kernel returns (the check's reference)
``exact``       float64 ``[M, N]``: the exact result (bounds: within one float64 spacing)
``actual``      the kernel's output as returned (its own dtype); absent when the kernel raised
==============  ==============================================================================

and, as the safetensors metadata entry ``swapcheck`` (also written beside it as ``<name>.json``
for people), one JSON object:

* ``format`` ("swapcheck.fuzz-failure"), ``format_version`` (1);
* ``kernel``: ``ref`` (as the user named it), ``params``, ``name``, ``version`` (as the registry
  reports it), ``kind`` ("scaled" / "matmul"), ``operands``, ``device``;
* ``check``: ``name`` ("exact_match" / "bounds"), ``dtype`` (the output format), ``algorithm``,
  ``accumulate``, ``fma`` and the trial's ``info`` (p, recipe, scale kind);
* ``shape`` (``m``, ``k``, ``n``), ``original_shape`` (before shrinking), ``seed``, ``trial``,
  ``recipe`` (the bounds recipe, or exact match's input kind: ``binary`` / ``cancelling-runs``),
  ``scales``, ``shrink_runs``;
* ``layout``: the operands' memory layout in the failing run (:data:`tasks.checks.fuzz.LAYOUTS`:
  ``contiguous``, ``a-transposed``, ``b-transposed``, ``both-transposed``, ``strided``); a replay
  hands the kernel the operands in that layout again.  Artifacts written before it was recorded
  have no ``layout`` and replay contiguous (the replay says so);
* ``verdict``, ``row`` (the check's trial row: counts, first and worst failing element with
  indices, exact, expected and observed values), ``actual_sha256`` (of the output's bytes).

:func:`replay` loads an artifact, runs the kernel and the check on exactly those operands and says
whether the recorded failure reproduces: the same verdict *and* the output byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tasks.numerics import get_format
from tasks.verdicts import Verdict

from .bounds import algorithm as get_algorithm
from .bounds import judge_bounds
from .exact_match import judge_exact_match
from .fuzz import LAYOUTS, apply_layout
from .result import Judged
from .subject import CheckInputError, load_subject

if TYPE_CHECKING:
    from .fuzz import Failure, FuzzSettings, Run
    from .subject import Subject

__all__ = ["FORMAT", "ArtifactError", "Artifact", "Replay", "artifact_bytes", "artifact_name",
           "save_artifact", "load_artifact", "replay", "tensor_bytes"]  # fmt: skip

FORMAT = "swapcheck.fuzz-failure"
FORMAT_VERSION = 1
_CHECKS = ("exact_match", "bounds")


class ArtifactError(CheckInputError):
    """An artifact that cannot be read: the message names the file and the field path."""


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a tensor (any dtype, bf16 and fp8 included), row-major."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _kernel_meta(subject: Subject, params: dict[str, Any]) -> dict[str, Any]:
    k = subject.kernel
    return {"ref": subject.ref, "params": params, "name": k.name, "version": k.version,
            "kind": subject.kind, "operands": subject.operands, "device": subject.device}  # fmt: skip


def artifact_name(fail: Failure) -> str:
    """``fuzz-<check>-trial<i>-<M>x<K>x<N>.safetensors``."""
    p = fail.shrunk.plan
    return f"fuzz-{fail.check.replace('_', '-')}-trial{p.index}-{p.shape}.safetensors"


def artifact_bytes(fail: Failure, subject: Subject, params: dict[str, Any], seed: int,
                   settings: FuzzSettings) -> tuple[bytes, dict[str, Any]]:  # fmt: skip
    """The safetensors bytes of a (shrunk) failure and its metadata object."""
    from safetensors.torch import save

    run: Run = fail.shrunk
    j = run.judged
    tensors: dict[str, torch.Tensor] = {"a": run.a.contiguous(), "b": run.b.contiguous()}
    if run.scale_a is not None and run.scale_b is not None:
        tensors["scale_a"], tensors["scale_b"] = run.scale_a.contiguous(), run.scale_b.contiguous()
    if j.expected is not None:
        tensors["expected"] = torch.from_numpy(np.ascontiguousarray(j.expected, dtype=np.float64))
    if j.exact is not None:
        tensors["exact"] = torch.from_numpy(np.ascontiguousarray(j.exact, dtype=np.float64))
    if isinstance(j.output, torch.Tensor):
        tensors["actual"] = j.output.contiguous()
    o = fail.original.plan
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kernel": _kernel_meta(subject, params),
        "check": {"name": fail.check, **settings.describe(), "info": run.info},
        "shape": {"m": run.plan.m, "k": run.plan.k, "n": run.plan.n},
        "original_shape": {"m": o.m, "k": o.k, "n": o.n},
        "seed": seed,
        "trial": run.plan.index,
        "recipe": run.plan.recipe if fail.check == "bounds" else run.info.get("inputs", "binary"),
        "layout": run.plan.layout,
        "scales": run.info.get("scales"),
        "shrink_runs": fail.shrink_runs,
        "verdict": j.result.verdict.value,
        "row": j.result.to_row(),
        "actual_sha256": hashlib.sha256(tensor_bytes(j.output)).hexdigest()
        if isinstance(j.output, torch.Tensor) else None,
        "versions": {"torch": torch.__version__},
    }
    return save(tensors, metadata={"swapcheck": json.dumps(meta, default=str, sort_keys=True)}), meta


def save_artifact(directory: str | Path, fail: Failure, subject: Subject, params: dict[str, Any], seed: int,
                  settings: FuzzSettings) -> Path:  # fmt: skip
    """Write the failure's artifact (and its JSON beside it) under ``directory``; return its path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    data, meta = artifact_bytes(fail, subject, params, seed, settings)
    path = d / artifact_name(fail)
    tmp = path.with_suffix(".safetensors.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2, default=str, sort_keys=True) + "\n")
    return path


@dataclass
class Artifact:
    """A loaded artifact: its metadata and tensors."""

    path: str
    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]


def _need(meta: dict[str, Any], path: str, where: str, kind: type | tuple[type, ...]) -> Any:
    cur: Any = meta
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise ArtifactError(f"{where}: {path}: missing")
        cur = cur[part]
    if not isinstance(cur, kind) or isinstance(cur, bool) and kind is int:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ArtifactError(f"{where}: {path}: expected {names}, got {type(cur).__name__} {cur!r}")
    return cur


#: The operand dtypes a kernel takes (tensors ``a`` and ``b``): anything else is a damaged or foreign artifact.
_OPERAND_DTYPE_NAMES = ("int8", "float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32")
_OPERAND_DTYPES = frozenset(getattr(torch, n) for n in _OPERAND_DTYPE_NAMES if hasattr(torch, n))


def load_artifact(path: str | Path) -> Artifact:
    """Read and validate an artifact.

    Raises:
        ArtifactError: not a file, not safetensors, not a swapcheck fuzz artifact, or a field
            missing or of the wrong type (the message names the file and the field path).
    """
    from safetensors import safe_open

    where = str(path)
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"{where}: no such file")
    try:
        with safe_open(str(p), framework="pt") as f:
            raw = (f.metadata() or {}).get("swapcheck")
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - not a dict
    except Exception as exc:  # safetensors raises its own errors (and OSError) for a bad header
        hint = "; give the .safetensors file, not its .json copy" if p.suffix == ".json" else ""
        raise ArtifactError(f"{where}: not a safetensors file ({type(exc).__name__}: {exc}){hint}") from exc
    if raw is None:
        raise ArtifactError(f"{where}: metadata.swapcheck: missing (not a swapcheck fuzz artifact)")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{where}: metadata.swapcheck: not JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise ArtifactError(f"{where}: metadata.swapcheck: expected an object")
    if meta.get("format") != FORMAT:
        raise ArtifactError(f"{where}: format: expected {FORMAT!r}, got {meta.get('format')!r}")
    if _need(meta, "format_version", where, int) != FORMAT_VERSION:
        raise ArtifactError(f"{where}: format_version: this swapcheck reads {FORMAT_VERSION}, got {meta['format_version']}")
    _need(meta, "kernel.ref", where, str)
    _need(meta, "kernel.params", where, dict)
    check = _need(meta, "check.name", where, str)
    if check not in _CHECKS:
        raise ArtifactError(f"{where}: check.name: expected one of {', '.join(_CHECKS)}, got {check!r}")
    dtype = _need(meta, "check.dtype", where, str)
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ArtifactError(f"{where}: check.dtype: expected bf16, fp16 or fp32, got {dtype!r}")
    _need(meta, "check.info", where, dict)
    if check == "bounds":
        _need(meta, "check.algorithm", where, str)
        _need(meta, "check.accumulate", where, str)
        _need(meta, "check.fma", where, bool)
    for dim in ("m", "k", "n"):
        _need(meta, f"shape.{dim}", where, int)
    _need(meta, "seed", where, int)
    _need(meta, "trial", where, int)
    _need(meta, "verdict", where, str)
    if "layout" in meta:
        layout = _need(meta, "layout", where, str)
        if layout not in LAYOUTS:
            raise ArtifactError(f"{where}: layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    m, k, n = meta["shape"]["m"], meta["shape"]["k"], meta["shape"]["n"]
    for name, shape in (("a", (m, k)), ("b", (k, n))):
        if name not in tensors:
            raise ArtifactError(f"{where}: tensors.{name}: missing")
        if tuple(tensors[name].shape) != shape:
            raise ArtifactError(f"{where}: tensors.{name}: shape {list(tensors[name].shape)}, expected {list(shape)}")
    for name in ("a", "b"):
        if tensors[name].dtype not in _OPERAND_DTYPES:
            raise ArtifactError(f"{where}: tensors.{name}: dtype {str(tensors[name].dtype).removeprefix('torch.')} is no "
                                f"kernel's operand dtype; expected one of {', '.join(_OPERAND_DTYPE_NAMES)}")
    if tensors["a"].dtype != tensors["b"].dtype:
        raise ArtifactError(f"{where}: tensors.a / b: dtypes differ ({tensors['a'].dtype} and {tensors['b'].dtype}); "
                            "a kernel takes both operands in one dtype")
    if ("scale_a" in tensors) != ("scale_b" in tensors):
        raise ArtifactError(f"{where}: tensors.scale_a / scale_b: give both or neither")
    for name in ("expected", "exact"):  # (``actual`` may have any shape: a wrong shape is a failure too)
        if name in tensors and tuple(tensors[name].shape) != (m, n):
            raise ArtifactError(f"{where}: tensors.{name}: shape {list(tensors[name].shape)}, expected {[m, n]}")
    return Artifact(where, meta, tensors)


@dataclass
class Replay:
    """What a replay found."""

    artifact: str
    kernel: str
    check: str
    shape: str
    recorded_verdict: str
    verdict: str
    same_output: bool
    same_expected: bool
    recorded_version: str | None
    version: str
    judged: Judged
    layout: str = "contiguous"
    layout_recorded: bool = True

    @property
    def reproduced(self) -> bool:
        """The recorded failure again: same verdict, output byte for byte."""
        return self.same_output and self.verdict == self.recorded_verdict

    def text(self) -> str:
        r = self.judged.result
        lines = [f"replay of {self.artifact}",
                 f"  {self.check.replace('_', '-')} check of {self.kernel} at {self.shape}",
                 f"  operand layout: {self.layout}" + ("" if self.layout_recorded else
                     " (not recorded: the artifact predates layouts; replayed contiguous)")]  # fmt: skip
        if self.recorded_version is not None and self.recorded_version != self.version:
            lines.append(f"  note: kernel version is now {self.version}; the artifact recorded {self.recorded_version}")
        lines.append(f"  recorded verdict {self.recorded_verdict}; now {self.verdict}")
        lines.append(f"  output {'identical, byte for byte' if self.same_output else 'DIFFERS from the recorded output'}; "
                     f"reference {'identical' if self.same_expected else 'DIFFERS (the oracle changed)'}")  # fmt: skip
        if r.first is not None:
            lines.append(f"  first failing element: {r.first.describe()}")
        if r.error:
            lines.append(f"  kernel raised: {r.error}")
        if self.reproduced:
            lines.append("reproduced: the recorded failure happens again, byte for byte")
        elif Verdict(self.verdict).passed:
            lines.append("NOT reproduced: the kernel now passes this case (fixed?)")
        else:
            lines.append(f"NOT reproduced byte for byte: the kernel still fails ({self.verdict}) but its output changed")
        return "\n".join(lines)


def replay(path: str | Path) -> Replay:
    """Re-run the artifact's kernel and check on exactly its operands.

    Raises:
        ArtifactError: a bad file (field path named); CheckInputError: the kernel cannot be loaded here.
    """
    art = load_artifact(path)
    meta, t = art.meta, art.tensors
    kmeta, cmeta = meta["kernel"], meta["check"]
    subject = load_subject(kmeta["ref"], kmeta["params"], operands=kmeta.get("operands"), field="kernel.ref")
    dtype = get_format(cmeta["dtype"]).torch_dtype
    sa, sb = t.get("scale_a"), t.get("scale_b")
    info = dict(cmeta["info"])
    layout = meta.get("layout", "contiguous")  # older artifacts: no layout recorded, replayed contiguous
    a, b = apply_layout(t["a"], t["b"], layout)
    if meta["check"]["name"] == "exact_match":
        judged = judge_exact_match(subject, a, b, dtype, sa, sb, trial=meta["trial"], seed=meta["seed"],
                                   info=info)  # fmt: skip
    else:
        alg = get_algorithm(cmeta["algorithm"], cmeta["accumulate"], cmeta["fma"])
        judged = judge_bounds(subject, alg, a, b, dtype, sa, sb, trial=meta["trial"], seed=meta["seed"],
                              info=info)  # fmt: skip
    out = judged.output
    rec = t.get("actual")
    if rec is None or not isinstance(out, torch.Tensor):
        same_out = rec is None and not isinstance(out, torch.Tensor)
    else:
        same_out = out.dtype == rec.dtype and out.shape == rec.shape and tensor_bytes(out) == tensor_bytes(rec)
    exp_rec = t.get("expected")
    same_exp = (exp_rec is None and judged.expected is None) or (
        exp_rec is not None and judged.expected is not None
        and np.asarray(judged.expected, dtype=np.float64).tobytes() == exp_rec.numpy().tobytes()
    )
    m, k, n = meta["shape"]["m"], meta["shape"]["k"], meta["shape"]["n"]
    return Replay(art.path, kmeta["ref"], cmeta["name"], f"{m}x{k}x{n}", meta["verdict"],
                  judged.result.verdict.value, same_out, bool(same_exp), kmeta.get("version"),
                  subject.kernel.version, judged, layout, "layout" in meta)  # fmt: skip
