"""The planner: expands a validated spec into units with content-addressed ids.

A unit id is the first 20 hex digits of the SHA-256 of the canonical JSON of its task kind, the task's
version and its parameters (kernel names, params and versions included), so the same work always has
the same id and a changed kernel or task version is new work.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from orchestrator.spec import (
    CheckExperiment,
    FilePrompts,
    GenerateExperiment,
    Implementation,
    KdepthExperiment,
    LoadedSpec,
    ReplayExperiment,
    Resources,
    axis_values,
)

#: Versions of each task's computation; bump when a task's rows would change for the same params.
TASK_VERSIONS = {"kdepth": "1", "replay": "1", "generate": "1", "teacher_forced": "1", "exact_match": "1",
                 "bounds": "1"}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def unit_id(kind: str, params: dict[str, Any]) -> str:
    payload = canonical_json({"kind": kind, "task_version": TASK_VERSIONS[kind], "params": params})
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Unit:
    id: str
    kind: str
    experiment: str
    params: dict[str, Any]
    resources: Resources = field(default_factory=Resources)
    #: Units run stage by stage: a later stage reads what an earlier one wrote.
    stage: int = 0
    #: Run in a fresh worker process that exits afterwards (a cold restart).
    fresh_process: bool = False

    def describe(self) -> str:
        p = self.params
        if self.kind == "kdepth":
            return f"{p['dtype']} M={p['m']} N={p['n']} K={p['k']} seed={p['seed']} scales={p['scale_mode']}"
        if self.kind in ("exact_match", "bounds"):
            alg = f" vs {p['algorithm']}" if self.kind == "bounds" else ""
            return f"{self.kind} {p['label']}{alg} {p['dtype']} M={p['m']} K={p['k']} N={p['n']} x{p['trials']}"
        if self.kind == "generate":
            return f"generate arm={p['arm']['name']} restart={p['restart']} ({p['arm']['kernel']}, {p['arm']['scales']} scales)"
        if self.kind == "teacher_forced":
            return f"teacher-forced {p['arm']['name']} on {p['reference']['name']}'s sequences"
        if self.kind == "replay":
            pairs = ", ".join(f"{a['name']}~{b['name']}" for a, b in p["pairs"])
            return f"replay {p['model']} (captured with {p['capture_kernel']['name']}): {pairs}; scales {'/'.join(p['scale_modes'])}"
        return canonical_json(p)

    def to_payload(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "experiment": self.experiment, "params": self.params}


@dataclass(frozen=True)
class Plan:
    sweep: str
    spec_sha256: str
    units: list[Unit]

    def by_id(self) -> dict[str, Unit]:
        return {u.id: u for u in self.units}


def _impl_payload(impl: Any) -> dict[str, Any]:
    from tasks.kernels import get_kernel

    kernel = get_kernel(impl.kernel, **impl.params)
    return {"name": impl.name, "kernel": impl.kernel, "params": dict(sorted(impl.params.items())), "version": kernel.version}


def _needs_gpu(impls: list[Any]) -> bool:
    from tasks.kernels import get_kernel

    return any(get_kernel(i.kernel, **i.params).device == "cuda" for i in impls)


def _kdepth_units(name: str, exp: KdepthExperiment) -> list[Unit]:
    impls = [_impl_payload(i) for i in exp.impls()]
    ref = _impl_payload(exp.ref())
    resources = exp.resources
    if resources.num_gpus == 0 and _needs_gpu([*exp.impls(), exp.ref()]):
        resources = resources.model_copy(update={"num_gpus": 1})
    units = []
    for m, n, k, seed, mode in itertools.product(
        axis_values(exp.m), axis_values(exp.n), axis_values(exp.k), exp.seed_values(), exp.scale_modes
    ):
        params = {
            "dtype": exp.dtype,
            "m": m,
            "n": n,
            "k": k,
            "seed": seed,
            "scale_mode": mode,
            "out_dtype": exp.out_dtype,
            "bias": exp.bias,
            "implementations": impls,
            "reference": ref,
        }
        units.append(Unit(unit_id("kdepth", params), "kdepth", name, params, resources))
    return units


def model_fingerprint(model: str) -> str:
    """Identity of a model for unit ids: the name, or a hash of a checkpoint's config and file list."""
    from pathlib import Path

    if model == "tiny-qwen3":
        return model
    d = Path(model)
    if not (d / "config.json").is_file():
        # A checkpoint only the cluster's GPU nodes hold (or a hub name vLLM resolves there).
        return f"{model}@unverified"
    h = hashlib.sha256((d / "config.json").read_bytes())
    for f in sorted(d.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return f"{d.name}@{h.hexdigest()[:16]}"


def read_prompt_file(path: str) -> list[list[int]]:
    """Token-id prompts from JSONL: each line a JSON list of ints or an object with "tokens"."""
    prompts = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            tokens = obj.get("tokens") if isinstance(obj, dict) else obj
            if not (isinstance(tokens, list) and tokens and all(isinstance(t, int) and t >= 0 for t in tokens)):
                raise ValueError(f"{path}:{i}: expected a non-empty list of token ids (ints >= 0)")
            prompts.append(tokens)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def _prompt_payload(prompts: Any) -> dict[str, Any]:
    if isinstance(prompts, FilePrompts):
        return {"tokens": read_prompt_file(prompts.file)}
    return {"synthetic": prompts.model_dump()}


def _arm_payload(name: str, arm: Any) -> dict[str, Any]:
    if arm.engine == "vllm":
        version = "vllm"
    else:
        from tasks.kernels import get_kernel

        version = get_kernel(arm.kernel, **arm.params).version
    return {"name": name, "kernel": arm.kernel, "params": dict(sorted(arm.params.items())), "version": version,
            "scales": arm.scales, "engine": arm.engine, "env": dict(sorted(arm.env.items()))}


def _generate_units(name: str, exp: GenerateExperiment) -> list[Unit]:
    # vLLM arms run on a GPU: ask Ray for one unless the spec asked for more.
    resources = exp.resources
    if any(a.engine == "vllm" for a in exp.arms.values()) and resources.num_gpus == 0:
        resources = resources.model_copy(update={"num_gpus": 1})
    common = {
        "model": exp.model,
        "model_fingerprint": model_fingerprint(exp.model),
        "model_seed": exp.model_seed,
        "prompts": _prompt_payload(exp.prompts),
        "max_new_tokens": exp.max_new_tokens,
        "top_k": exp.top_k,
    }
    units: list[Unit] = []
    restart0: dict[str, str] = {}
    for arm_name, arm in exp.arms.items():
        for restart in range(exp.restarts):
            params = {**common, "arm": _arm_payload(arm_name, arm), "restart": restart}
            u = Unit(unit_id("generate", params), "generate", name, params, resources, stage=0, fresh_process=True)
            units.append(u)
            if restart == 0:
                restart0[arm_name] = u.id
    for tf in exp.teacher_forced:
        ref = {**_arm_payload(tf.reference, exp.arms[tf.reference]), "unit_id": restart0[tf.reference]}
        for other in tf.arms:
            params = {**common, "reference": ref, "arm": _arm_payload(other, exp.arms[other])}
            units.append(Unit(unit_id("teacher_forced", params), "teacher_forced", name, params, resources,
                              stage=1, fresh_process=True))
    return units


def _check_units(name: str, exp: CheckExperiment) -> list[Unit]:
    units = []
    for impl in exp.impls():
        version = _impl_payload(impl)["version"]
        for m, k, n in exp.shapes:
            params: dict[str, Any] = {"kernel": impl.kernel, "params": dict(sorted(impl.params.items())), "label": impl.name,
                                      "version": version, "dtype": exp.dtype, "m": m, "k": k, "n": n,
                                      "trials": exp.trials, "seed": exp.seed, "scales": exp.scales}
            if exp.kind == "bounds":
                params.update(algorithm=exp.algorithm, accumulate=exp.accumulate)
            units.append(Unit(unit_id(exp.kind, params), exp.kind, name, params, exp.resources))
    return units


def _replay_units(name: str, exp: ReplayExperiment) -> list[Unit]:
    prompts = _prompt_payload(exp.prompts)
    params = {
        "model": exp.model,
        "model_fingerprint": model_fingerprint(exp.model),
        "model_seed": exp.model_seed,
        "engine": exp.engine,
        "capture_kernel": (_impl_payload(Implementation(kernel=exp.capture_kernel)) if exp.engine == "cpu" else
                           {"name": exp.capture_kernel, "kernel": exp.capture_kernel, "params": {}, "version": "vllm"}),
        "pairs": [[_impl_payload(a), _impl_payload(b)] for a, b in exp.impl_pairs()],
        "scale_modes": list(exp.scale_modes),
        "prompts": prompts,
        "out_dtype": exp.out_dtype,
    }
    resources = exp.resources
    pair_impls = [i for pair in exp.impl_pairs() for i in pair]
    if resources.num_gpus == 0 and (exp.engine == "vllm" or _needs_gpu(pair_impls)):
        resources = resources.model_copy(update={"num_gpus": 1})
    return [Unit(unit_id("replay", params), "replay", name, params, resources)]


def make_plan(spec: LoadedSpec) -> Plan:
    """Expand every experiment; units come out in spec order, duplicates merged."""
    units: dict[str, Unit] = {}
    for name, exp in spec.experiments.items():
        if isinstance(exp, KdepthExperiment):
            for u in _kdepth_units(name, exp):
                units.setdefault(u.id, u)
        elif isinstance(exp, ReplayExperiment):
            for u in _replay_units(name, exp):
                units.setdefault(u.id, u)
        elif isinstance(exp, GenerateExperiment):
            for u in _generate_units(name, exp):
                units.setdefault(u.id, u)
        elif isinstance(exp, CheckExperiment):
            for u in _check_units(name, exp):
                units.setdefault(u.id, u)
        else:  # pragma: no cover - guarded by EXPERIMENT_MODELS
            raise TypeError(f"no planner for {type(exp).__name__}")
    return Plan(sweep=spec.sweep.name, spec_sha256=spec.sha256, units=list(units.values()))
