"""The ``localize`` kind: where two INT8 kernels make a greedy generation part, and which linears do it.

One unit per (arm pair, prompt), on the CPU W8A8 engine, every generation of ONE prompt (batch 1):

1. **First divergence**: greedy generation of ``max_new_tokens`` tokens with every W8A8 linear on
   kernel A (all-A), and with every linear on kernel B (all-B); the first generated position where
   the tokens differ (null: identical throughout).  The rest runs only for a diverging prompt.
2. **First differing layer**: both arms teacher-forced on the same tokens -- the prompt and the
   all-A tokens before the divergence, so the last position is the step that chose the diverging
   token -- with a forward hook on every W8A8 linear and decoder layer recording the sha256 of its
   output bytes, in forward order; the first linear and the first decoder layer whose hash differs.
3. **Culprit set**: delta debugging (ddmin) over the linears (7 per decoder layer, in forward order)
   for a 1-minimal set S such that generating with only S on kernel B (every other linear on A)
   differs from all-A at or before the all-B divergence position.  Verified by fresh generations:
   with S swapped it diverges (position recorded); with none swapped it reproduces all-A through
   ``max_new_tokens``; removing any one element of S no longer diverges (1-minimal).  The number of
   generations the search ran is recorded (the verification's are not counted in it).
4. **Replay artifact**: the culprit linears' operands in the all-A teacher-forced pass of step 2,
   both kernels' outputs, their sha256 and first differing element (``tasks.models.culprit``,
   format ``swapcheck.localize-culprit``), replayed once in the unit; ``swapcheck check replay FILE``
   replays it again anywhere.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tasks.kinds.base import Kind, Rows, Unit, UnitContext
from tasks.kinds.fields import (
    MAX_SEED,
    Implementation,
    Prompts,
    Resources,
    ScaleMode,
    Strict,
    SyntheticPrompts,
    check_arm_names,
    check_params_data,
    impl_payload,
    kernel_problem,
    model_and_prompt_problems,
    model_fingerprint,
    prompt_payload,
    resolve_model_and_prompts,
)

VERSION = "1"


class LocalizeArm(Strict):
    """One side of a pair: a CPU registry INT8 kernel (name or ``module:attr``) and its parameters."""

    kernel: str = Field(min_length=1, max_length=300)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_params_data(v)


class LocalizeExperiment(Strict):
    """First divergence, first differing layer and a minimal culprit set per (arm pair, prompt)."""

    kind: Literal["localize"]
    model: str = "tiny-qwen3"
    model_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    arms: dict[str, LocalizeArm] = Field(min_length=2)
    #: [A, B] arm names; A is the reference. Default: the two arms, in the order given (exactly two).
    pairs: list[list[str]] = Field(default_factory=list)
    scales: ScaleMode = "real"
    #: An attention kernel of tasks.attention both arms run (None: the engine's float64 attention).
    attention: str | None = None
    out_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    prompts: Prompts = Field(default_factory=SyntheticPrompts)
    #: Which prompts (0-based indices into ``prompts``) to localize; None: all of them.
    prompt_indices: list[int] | None = Field(default=None, min_length=1)
    max_new_tokens: int = Field(default=64, ge=1, le=4096)
    #: The most generations the culprit search of one prompt may run before the unit fails.
    max_generations: int = Field(default=400, ge=1, le=100_000)
    resources: Resources = Field(default_factory=Resources)

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, v: dict[str, LocalizeArm]) -> dict[str, LocalizeArm]:
        return check_arm_names(v)

    @field_validator("prompt_indices")
    @classmethod
    def _indices(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if any(i < 0 for i in v):
            raise ValueError(f"prompt indices must be >= 0, got {[i for i in v if i < 0]}")
        if len(set(v)) != len(v):
            raise ValueError("prompt indices must be distinct")
        return v

    @model_validator(mode="after")
    def _pairs(self) -> LocalizeExperiment:
        if not self.pairs and len(self.arms) != 2:
            raise ValueError(f"pairs: required when there are {len(self.arms)} arms (only two arms make a "
                             "default pair)")
        for i, pair in enumerate(self.pairs):
            if len(pair) != 2:
                raise ValueError(f"pairs[{i}]: name exactly two arms [A, B], got {len(pair)}")
            for name in pair:
                if name not in self.arms:
                    raise ValueError(f"pairs[{i}]: unknown arm {name!r}; arms: {', '.join(self.arms)}")
            if pair[0] == pair[1]:
                raise ValueError(f"pairs[{i}]: both sides are {pair[0]!r}")
        return self

    def arm_pairs(self) -> list[tuple[str, str]]:
        """The pairs (A, B) to localize: ``pairs``, or the two arms in the order given."""
        pairs = self.pairs or [list(self.arms)]
        return [(a, b) for a, b in pairs]

    def indices(self) -> list[int]:
        if self.prompt_indices is not None:
            return list(self.prompt_indices)
        if isinstance(self.prompts, SyntheticPrompts):
            return list(range(self.prompts.count))
        from tasks.prompts import read_prompt_records

        return list(range(len(read_prompt_records(self.prompts.file)[0])))


def problems(base: str, exp: LocalizeExperiment) -> list[str]:
    out = []
    for name, arm in exp.arms.items():
        p = kernel_problem(f"{base}.arms.{name}.kernel", Implementation(kernel=arm.kernel, params=arm.params), "int8")
        if p:
            out.append(p)
        else:
            from tasks.kernels import get_kernel

            if get_kernel(arm.kernel, **arm.params).device != "cpu":
                out.append(f"{base}.arms.{name}.kernel: {arm.kernel!r} runs on cuda; localize runs the CPU engine "
                           "(allowed: a CPU INT8 kernel)")
    if exp.attention is not None:
        from tasks.attention.fields import attention_problem

        p = attention_problem(f"{base}.attention", exp.attention, "cpu")
        if p:
            out.append(p)
    problems_before = len(out)
    out.extend(model_and_prompt_problems(base, exp.model, exp.prompts))
    if exp.prompt_indices is not None and len(out) == problems_before:
        count = len(LocalizeExperiment.indices(exp.model_copy(update={"prompt_indices": None})))
        bad = [i for i in exp.prompt_indices if i >= count]
        if bad:
            out.append(f"{base}.prompt_indices: {bad} out of range; the prompts hold {count} (allowed 0..{count - 1})")
    return out


def _arm_payload(name: str, arm: LocalizeArm) -> dict[str, Any]:
    return impl_payload(Implementation(kernel=arm.kernel, params=arm.params, label=name))


def expand(experiment: str, exp: LocalizeExperiment) -> list[Unit]:
    common: dict[str, Any] = {
        "model": exp.model,
        "model_fingerprint": model_fingerprint(exp.model),
        "model_seed": exp.model_seed,
        "scales": exp.scales,
        "attention": exp.attention,
        "out_dtype": exp.out_dtype,
        "prompts": prompt_payload(exp.prompts),
        "max_new_tokens": exp.max_new_tokens,
        "max_generations": exp.max_generations,
    }
    units = []
    for a, b in exp.arm_pairs():
        pair = {"arm_a": _arm_payload(a, exp.arms[a]), "arm_b": _arm_payload(b, exp.arms[b])}
        for i in exp.indices():
            units.append(KIND.unit(experiment, {**common, **pair, "prompt_index": i}, exp.resources))
    return units


def describe(p: dict[str, Any]) -> str:
    return (f"localize {p['arm_a']['name']}~{p['arm_b']['name']} prompt {p['prompt_index']} "
            f"({p['model']}, {p['scales']} scales, {p['max_new_tokens']} tokens)")


def _kernel_ref(arm: dict[str, Any]) -> dict[str, Any]:
    return {"kernel": arm["kernel"], "params": arm["params"]}


def localize_prompt(model: Any, prompt: list[int], arm_a: dict[str, Any], arm_b: dict[str, Any],
                    max_new_tokens: int, max_generations: int) -> tuple[dict[str, Any], list[Any], list[int]]:
    """Steps 1-3 of the module docstring for one prompt: the row's figures and, for a diverging
    prompt, the culprit linears' captured calls in the all-A teacher-forced pass and the tokens that
    pass read (else [] and [])."""
    from tasks.models.localize import (
        Swapper,
        boundary_hashes,
        ddmin,
        first_differing,
        first_divergence,
    )

    ka, kb = _kernel_ref(arm_a), _kernel_ref(arm_b)
    base = Swapper(model, prompt, ka, kb, [], horizon=max_new_tokens, budget=2)
    toks_a = base.generate([])
    gen_a = base.last
    toks_b = base.generate(list(model.linears()))
    gen_b = base.last
    d = first_divergence(toks_a, toks_b)
    row: dict[str, Any] = {"generated": len(toks_a), "first_divergence": d}
    if d is None:
        return row, [], []
    row.update({"token_a": toks_a[d], "token_b": toks_b[d], "margin_a": float(gen_a.margins[0][d]),
                "margin_b": float(gen_b.margins[0][d])})
    # 2. layer-boundary hashes, both arms teacher-forced on the same prefix
    prefix = list(prompt) + toks_a[:d]
    model.set_kernel(kb)
    rec_b, logits_b = boundary_hashes(model, prefix)
    model.set_kernel(ka)
    with model.capture() as cap:
        rec_a, logits_a = boundary_hashes(model, prefix)
    lin = first_differing(rec_a, rec_b, "linear")
    lay = first_differing(rec_a, rec_b, "layer")
    names = [r.name for r in rec_a if r.kind == "linear"]
    row.update({
        "first_diff_linear": lin.name if lin else None,
        "first_diff_linear_order": names.index(lin.name) if lin else None,
        "first_diff_layer": lay.index if lay else None,
        "linears_differing": sum(x.sha256 != y.sha256 for x, y in zip(rec_a, rec_b, strict=True) if x.kind == "linear"),
        "linears_hashed": len(names),
        "tf_reproduces": int(logits_a[-1].argmax()) == toks_a[d] and int(logits_b[-1].argmax()) == toks_b[d],
    })
    # 3. ddmin over the linears, the predicate: diverges from all-A at or before position d
    sw = Swapper(model, prompt, ka, kb, toks_a, horizon=d + 1, budget=max_generations)
    culprit, tests = ddmin(list(model.linears()), sw.diverges)
    row.update({"culprit": culprit, "culprit_size": len(culprit), "bisection_generations": sw.generations,
                "bisection_tests": tests})
    verify = Swapper(model, prompt, ka, kb, toks_a, horizon=d + 1, budget=len(culprit) + 2)
    pos = verify.divergence(culprit)
    none_tokens = verify.generate([], max_new_tokens)
    row.update({
        "culprit_divergence": pos,
        "verified_culprit_diverges": pos is not None,
        "verified_none_identical": none_tokens == toks_a,
        "verified_one_minimal": all(not verify.diverges([x for x in culprit if x != c]) for c in culprit),
        "verification_generations": verify.generations,
    })
    return row, culprit_calls(model, cap, culprit, prefix, ka, kb), prefix


def culprit_calls(model: Any, cap: Any, culprit: list[str], prefix: list[int], ka: dict[str, Any],
                  kb: dict[str, Any]) -> list[Any]:
    """The culprit linears' calls for the artifact: from the all-A pass, or -- for a linear on whose
    all-A operands both kernels agree (it differs only once an upstream member of S changed its
    input) -- from the same pass with S on kernel B; ``operands_from`` on each call says which."""
    from tasks.models.culprit import outputs_differ

    wanted = set(culprit)
    calls = [c for c in cap.layers if c.name in wanted]
    for c in calls:
        c.operands_from = "all-A"
    if all(outputs_differ(c, ka, kb) for c in calls):
        return calls
    model.set_kernel(ka)
    model.set_kernel(kb, culprit)
    try:
        with model.capture() as mixed:
            model.forward_tokens([prefix])
    finally:
        model.set_kernel(ka)
    alt = {c.name: c for c in mixed.layers if c.name in wanted}
    for i, c in enumerate(calls):
        if not outputs_differ(c, ka, kb) and outputs_differ(alt[c.name], ka, kb):
            alt[c.name].operands_from = "culprit-on-B"
            calls[i] = alt[c.name]
    return calls


#: Row columns a prompt that never diverged leaves null (besides the error).
_NULLABLE = ("first_divergence", "token_a", "token_b", "margin_a", "margin_b", "first_diff_linear",
             "first_diff_linear_order", "first_diff_layer", "linears_differing", "linears_hashed", "tf_reproduces",
             "culprit", "culprit_size", "bisection_generations", "bisection_tests", "culprit_divergence",
             "verified_culprit_diverges", "verified_none_identical", "verified_one_minimal",
             "verification_generations", "artifact", "artifact_sha256", "artifact_reproduces")


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    """One (pair, prompt): the ``localize`` row (docs/schema.md), and the culprit artifact."""
    from tasks.models import build_model
    from tasks.models.culprit import culprit_bytes
    from tasks.models.localize import BisectionBudgetError
    from tasks.prompts import prompts_from_payload

    arm_a, arm_b = params["arm_a"], params["arm_b"]
    model = build_model(params["model"], kernel=_kernel_ref(arm_a), scales=params["scales"],
                        seed=params["model_seed"], out_dtype=params["out_dtype"], attention=params["attention"])
    prompts = prompts_from_payload(params["prompts"], int(model.config.vocab_size))
    i = params["prompt_index"]
    prompt = prompts[i]
    row: dict[str, Any] = {
        "model": params["model"], "pair": f"{arm_a['name']}~{arm_b['name']}", "arm_a": arm_a["name"],
        "arm_b": arm_b["name"], "kernel_a": arm_a["kernel"], "kernel_b": arm_b["kernel"], "scales": params["scales"],
        "prompt_index": i, "prompt_tokens": len(prompt), "max_new_tokens": params["max_new_tokens"],
        **dict.fromkeys(_NULLABLE), "error": None,
    }
    try:
        figures, layers, prefix = localize_prompt(model, prompt, arm_a, arm_b, params["max_new_tokens"],
                                          params["max_generations"])
    except BisectionBudgetError as exc:
        row["error"] = str(exc)
        return {"localize": [row]}
    row.update(figures)
    if layers:
        info = {"model": model.identity(), "prompt_index": i, "prompt": prompt, "prefix": prefix,
                "first_divergence": figures["first_divergence"], "culprit": figures["culprit"]}
        data, _ = culprit_bytes(layers, arm_a, arm_b, info)
        row["artifact_sha256"] = hashlib.sha256(data).hexdigest()
        row["artifact_reproduces"] = _replays(data)
        if context is not None:
            row["artifact"] = context.put_artifact(f"culprit-{row['pair']}-prompt{i}.safetensors", data)
    return {"localize": [row]}


def _replays(data: bytes) -> bool:
    """The artifact, written to a temporary file and replayed: both outputs again byte for byte."""
    import tempfile
    from pathlib import Path

    from tasks.models.culprit import replay_culprit

    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "culprit.safetensors"
        p.write_bytes(data)
        return replay_culprit(p).reproduced


EXAMPLE = {
    "kind": "localize",
    "model": "tiny-qwen3",
    "arms": {"cutlass": {"kernel": "int8-cutlass-order"}, "triton": {"kernel": "int8-triton-order"}},
    "prompts": {"count": 2, "length": 8, "seed": 0},
    "max_new_tokens": 8,
}

KIND = Kind(name="localize", version=VERSION, spec=LocalizeExperiment, tables=("localize",), describe=describe,
            run=run, expand=expand, problems=problems, resolve=resolve_model_and_prompts, doc=__doc__ or "",
            example=EXAMPLE)
