"""The ``generate`` kind: one cold restart of one arm — a fresh process, greedy decoding, evidence.

The runner gives every generate unit a fresh worker process (Ray ``max_calls=1``), so no engine,
cache or kernel choice carries over between restarts. The arm's environment (variables that select
kernels) is applied before the model is built. Which kernel each layer actually called is counted at
run time; a unit whose observed kernels differ from the configured one fails with an error instead of
producing rows, because a run that did not test what it claims must never count.

On the vLLM engine, restart 0 (the restart teacher_forced units read) also scores its own sequences
teacher-forced in the same process and records each generated token's log-probability there
(``generations.teacher_forced_token_logprob``, :func:`teacher_forced_logprobs`): the reference side
of the teacher_forced probability columns, which another arm's process cannot compute (vLLM chooses
kernels once per process; docs/divergence.md).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tasks.kinds.base import Kind, Rows, Unit, UnitContext
from tasks.kinds.fields import (
    MAX_SEED,
    FilePrompts,
    Implementation,
    Prompts,
    Resources,
    ScaleMode,
    Strict,
    SyntheticPrompts,
    check_arm_names,
    check_params_data,
    kernel_problem,
    model_and_prompt_problems,
    model_fingerprint,
    prompt_payload,
    resolve_model_and_prompts,
)

VERSION = "1"


class Arm(Strict):
    """One way of running the model: a kernel, a scale mode and the environment that selects kernels.

    ``engine = "cpu"``: ``kernel`` is a registry kernel run by the CPU W8A8 engine. ``engine =
    "vllm"``: ``kernel`` is a vLLM kernel family (``cutlass-int8``, ``triton-int8``, ``cutlass-fp8``,
    ``torch-fp8``) forced per installed vLLM version (docs/gpu.md); such units request a GPU.
    """

    kernel: str = "int8-cutlass-order"
    params: dict[str, Any] = Field(default_factory=dict)
    scales: ScaleMode = "real"
    engine: Literal["cpu", "vllm"] = "cpu"
    env: dict[str, str] = Field(default_factory=dict)
    #: The attention kernel (tasks.attention registry name) every attention layer runs: a CPU entry
    #: on the CPU engine, a vLLM backend (``vllm-flash-attn``, ...) on the vLLM engine. None: the
    #: engine's default (the CPU engine's float64 attention; vLLM's own choice).
    attention: str | None = None
    #: An INT8 activation quantizer from tasks.quantizers (docs/quantizers.md) replacing the engine's
    #: own (``vllm-int8``), with ``quantizer_params``. None: the engine's own; arms without it keep
    #: their unit ids.
    quantizer: str | None = None
    quantizer_params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params", "quantizer_params")
    @classmethod
    def _params(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_params_data(v)


class TeacherForcing(Strict):
    """Score the ``reference`` arm's restart-0 sequences with each of ``arms`` (teacher forcing)."""

    reference: str
    arms: list[str] = Field(min_length=1)


class GenerateExperiment(Strict):
    """Cold-restart greedy generation per arm, and teacher-forced replay across arms."""

    kind: Literal["generate"]
    model: str = "tiny-qwen3"
    model_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    arms: dict[str, Arm] = Field(min_length=1)
    restarts: int = Field(default=2, ge=1, le=64)
    prompts: Prompts = Field(default_factory=SyntheticPrompts)
    max_new_tokens: int = Field(default=32, ge=1, le=8192)
    top_k: int = Field(default=5, ge=2, le=64)
    teacher_forced: list[TeacherForcing] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, v: dict[str, Arm]) -> dict[str, Arm]:
        return check_arm_names(v)

    @model_validator(mode="after")
    def _tf_arms(self) -> GenerateExperiment:
        for i, tf in enumerate(self.teacher_forced):
            for name in [tf.reference, *tf.arms]:
                if name not in self.arms:
                    raise ValueError(f"teacher_forced[{i}]: unknown arm {name!r}; arms: {', '.join(self.arms)}")
            if tf.reference in tf.arms:
                raise ValueError(f"teacher_forced[{i}]: the reference arm {tf.reference!r} is also listed in arms")
        return self


def problems(base: str, exp: GenerateExperiment) -> list[str]:
    out = []
    vllm = [name for name, arm in exp.arms.items() if arm.engine == "vllm"]
    for name, arm in exp.arms.items():
        if arm.engine == "vllm":
            from tasks.models.vllm_selection import FAMILIES

            if arm.kernel not in FAMILIES and arm.kernel not in ("cutlass", "triton", "torch"):
                out.append(f"{base}.arms.{name}.kernel: {arm.kernel!r} is not a vLLM kernel family; allowed: {', '.join(FAMILIES)}")
            if arm.scales != "real":
                out.append(f"{base}.arms.{name}.scales: the vLLM engine runs a checkpoint's own scales; make a power-of-two probe checkpoint for pow2")
            continue
        p = kernel_problem(f"{base}.arms.{name}.kernel", Implementation(kernel=arm.kernel, params=arm.params), "int8")
        if p:
            out.append(p)
        out.extend(arm_quantizer_problems(f"{base}.arms.{name}", arm))
    for name, arm in exp.arms.items():
        if arm.attention is not None:
            from tasks.attention.fields import attention_problem

            p = attention_problem(f"{base}.arms.{name}.attention", arm.attention, arm.engine)
            if p:
                out.append(p)
    if vllm and len(vllm) != len(exp.arms):
        out.append(f"{base}.arms: mix of vllm arms {vllm} and cpu arms; put them in separate experiments")
    if isinstance(exp.prompts, FilePrompts):
        out.extend(answer_length_problems(base, exp))
    if not vllm:
        out.extend(model_and_prompt_problems(base, exp.model, exp.prompts))
    elif isinstance(exp.prompts, FilePrompts):
        out.extend(model_and_prompt_problems(base, "tiny-qwen3", exp.prompts))
    return out


def answer_length_problems(base: str, exp: GenerateExperiment) -> list[str]:
    """A prompt file's expected answers must fit in ``max_new_tokens`` (else no answer can be right)."""
    from tasks.prompts import read_prompt_records

    assert isinstance(exp.prompts, FilePrompts)
    try:
        _, answers = read_prompt_records(exp.prompts.file)
    except (ValueError, OSError):
        return []  # reported by model_and_prompt_problems
    longest = max((len(a) for a in answers if a is not None), default=0)
    if longest > exp.max_new_tokens:
        return [f"{base}.max_new_tokens: {exp.max_new_tokens} is shorter than the longest expected answer "
                f"in {exp.prompts.file} ({longest} tokens); allowed: >= {longest}"]
    return []


def arm_quantizer_problems(where: str, arm: Arm) -> list[str]:
    """An arm's ``quantizer``: a registry INT8 quantizer, on the CPU engine, with real scales."""
    if arm.quantizer is None:
        return [f"{where}.quantizer_params: set only with `quantizer`"] if arm.quantizer_params else []
    from tasks.kinds.fields import QuantizerRef, quantizer_problem
    from tasks.quantizers import get_quantizer

    p = quantizer_problem(f"{where}.quantizer", QuantizerRef(quantizer=arm.quantizer, params=arm.quantizer_params))
    if p:
        return [p]
    out = []
    q = get_quantizer(arm.quantizer, **arm.quantizer_params)
    if q.out_dtype != "int8":
        out.append(f"{where}.quantizer: {arm.quantizer!r} produces {q.out_dtype}; the W8A8 engine takes int8 activations")
    if arm.scales != "real":
        out.append(f"{where}.quantizer: a quantizer forms its own scales; use scales = \"real\"")
    return out


def arm_payload(name: str, arm: Arm) -> dict[str, Any]:
    code = None
    if arm.engine == "vllm":
        version = "vllm"
    else:
        from tasks.kernels import get_kernel
        from tasks.kernels.registry import kernel_code

        version = get_kernel(arm.kernel, **arm.params).version
        code = kernel_code(arm.kernel)  # a user's kernel: its code's fingerprint (tasks/fingerprint.py)
    payload = {"name": name, "kernel": arm.kernel, "params": dict(sorted(arm.params.items())), "version": version,
               "scales": arm.scales, "engine": arm.engine, "env": dict(sorted(arm.env.items()))}
    if code is not None:  # only for a user's kernel: built-in arms keep their unit ids
        payload["code"] = code
    if arm.attention is not None:  # only when set: arms without it keep their unit ids
        from tasks.attention.fields import attention_payload

        payload["attention"] = attention_payload(arm.attention)
    if arm.quantizer is not None:  # only when set: arms without it keep their unit ids
        from tasks.kinds.fields import QuantizerRef, quantizer_payload

        payload["quantizer"] = quantizer_payload(QuantizerRef(quantizer=arm.quantizer, params=arm.quantizer_params))
    return payload


def expand(experiment: str, exp: GenerateExperiment) -> list[Unit]:
    """Every arm's cold restarts (stage 0), then the teacher-forced units that read them (stage 1)."""
    from tasks.kinds import get_kind

    # vLLM arms run on a GPU: ask Ray for one unless the spec asked for more.
    on_vllm = any(a.engine == "vllm" for a in exp.arms.values())
    resources = exp.resources.with_gpu(on_vllm)
    needs = ("vllm",) if on_vllm else ()
    common = {
        "model": exp.model,
        "model_fingerprint": model_fingerprint(exp.model),
        "model_seed": exp.model_seed,
        "prompts": prompt_payload(exp.prompts),
        "max_new_tokens": exp.max_new_tokens,
        "top_k": exp.top_k,
    }
    units: list[Unit] = []
    restart0: dict[str, str] = {}
    for arm_name, arm in exp.arms.items():
        for restart in range(exp.restarts):
            params = {**common, "arm": arm_payload(arm_name, arm), "restart": restart}
            u = KIND.unit(experiment, params, resources, stage=0, fresh_process=True, needs=needs)
            units.append(u)
            if restart == 0:
                restart0[arm_name] = u.id
    scorer = get_kind("teacher_forced")
    for tf in exp.teacher_forced:
        ref = {**arm_payload(tf.reference, exp.arms[tf.reference]), "unit_id": restart0[tf.reference]}
        for other in tf.arms:
            params = {**common, "reference": ref, "arm": arm_payload(other, exp.arms[other])}
            units.append(scorer.unit(experiment, params, resources, stage=1, fresh_process=True, needs=needs))
    return units


def describe(p: dict[str, Any]) -> str:
    att = f", attention {p['arm']['attention']['name']}" if p["arm"].get("attention") else ""
    att += f", quantizer {p['arm']['quantizer']['name']}" if p["arm"].get("quantizer") else ""
    return f"generate arm={p['arm']['name']} restart={p['restart']} ({p['arm']['kernel']}, {p['arm']['scales']} scales{att})"


def run(params: dict[str, Any], context: UnitContext | None = None) -> dict[str, Rows]:
    from tasks.kernels import get_kernel
    from tasks.models.arms import build_arm_model, build_vllm_engine, vllm_prompts
    from tasks.models.evidence import kernel_evidence
    from tasks.models.predictions import sequence_hash
    from tasks.prompts import answers_from_payload, prompts_from_payload

    arm = params["arm"]
    token_logprobs: list[Any] | None = None  # vLLM restart 0: teacher-forced log-probability per generated token
    if arm["engine"] == "vllm":
        engine = build_vllm_engine(params)
        prompts = vllm_prompts(params)
        engine.reset_kernel_calls()
        gen = engine.generate(prompts, params["max_new_tokens"], top_k=params["top_k"])
        evidence = engine.require_evidence()  # raises KernelEvidenceError: a run must test what it claims
        calls = engine.kernel_calls()
        configured = evidence["configured"]
        observed = sorted(evidence["layer_kernels"])
        weights = engine.weights_sha256()
        if params["restart"] == 0:  # the restart teacher_forced units read: its side of their probabilities
            token_logprobs, replay = teacher_forced_logprobs(engine, gen.prompts, gen.tokens)
            evidence = {**engine.require_evidence(), "teacher_forced_replay": replay}  # the scoring pass's kernels too
    else:
        model = build_arm_model(params)
        prompts = prompts_from_payload(params["prompts"], int(model.config.vocab_size))
        model.reset_kernel_calls()
        from tasks.models.hf_attention import attention_calls, require_attention_calls

        attention_before = attention_calls()
        gen = model.generate(prompts, params["max_new_tokens"], top_k=params["top_k"])
        calls = model.kernel_calls()
        configured = get_kernel(arm["kernel"], **arm["params"]).name
        observed, ok, problem = kernel_evidence(calls, configured)
        if not ok:
            raise RuntimeError(f"kernel-selection evidence does not match the arm {arm['name']!r}: {problem}")
        if arm.get("attention") is not None:
            require_attention_calls(arm["attention"]["name"], arm["name"], attention_before)
        evidence = {"ok": True, **({"quantizer": arm["quantizer"]} if arm.get("quantizer") else {})}
        weights = model.weights_sha256()
    ident = {"arm": arm["name"], "restart": params["restart"]}
    generations = [
        {**ident, "prompt_index": r["sequence"], "position": r["position"], "token": r["token"],
         "margin": r["margin"], "topk_ids": r["topk_ids"], "topk_logits": r["topk_logits"]}
        for r in gen.rows()
    ]
    if token_logprobs is not None:
        from tasks.models.vllm_rows import TEACHER_FORCED_LOGPROB

        for row in generations:
            row[TEACHER_FORCED_LOGPROB] = float(token_logprobs[row["prompt_index"]][row["position"]])
    answers = answers_from_payload(params["prompts"]) or [None] * len(gen.prompts)
    sequences = [
        {**ident, "prompt_index": i, "prompt_hash": sequence_hash(p), "sequence_hash": sequence_hash(t),
         "n_tokens": len(t), "tokens": t, **answer_columns(t, a)}
        for i, (p, t, a) in enumerate(zip(gen.prompts, gen.tokens, answers, strict=True))
    ]
    run_row = {
        **ident, "model": params["model"], "engine": arm["engine"], "configured_kernel": configured,
        "attention": (arm.get("attention") or {}).get("name") or ("fp64" if arm["engine"] == "cpu" else None),
        "scales": arm["scales"], "env_json": json.dumps(arm["env"], sort_keys=True), "host": socket.gethostname(),
        "pid": os.getpid(), "observed_kernels": observed,
        "kernel_calls_json": json.dumps({"calls": calls, "evidence": evidence}, sort_keys=True, default=str),
        "evidence_ok": bool(evidence["ok"]), "weights_sha256": weights,
    }
    return {"generations": generations, "sequences": sequences, "arm_runs": [run_row]}


def teacher_forced_logprobs(engine: Any, prompts: list[list[int]],
                            generated: list[list[int]]) -> tuple[list[Any], dict[str, Any]]:
    """A vLLM arm's side of the teacher-forced probability columns (tasks/kinds/teacher_forced.py):
    its own sequences (prompt + generated tokens) scored teacher-forced in this process, with this
    arm's kernels, and per prompt the float64 log-probability of each generated token there
    (``VllmEngine.score_logprobs``, :func:`tasks.models.vllm_rows.generated_logprobs`).

    Also what the replay says of the decoding: generated positions whose teacher-forced argmax is
    another token than the one decoded (vLLM's decode steps and one prefill pass over the whole
    sequence are different computations), recorded in the unit's evidence."""
    from tasks.models.vllm_rows import TEACHER_FORCED_LOGPROB, generated_logprobs

    sequences = [p + g for p, g in zip(prompts, generated, strict=True)]
    scores, per_sequence = engine.score_logprobs(sequences, top_k=2, starts=[len(p) - 1 for p in prompts])
    out = generated_logprobs(prompts, generated, per_sequence)
    differ = 0
    for p, g, am in zip(prompts, generated, scores.argmax, strict=True):
        first = len(p) - 1
        differ += sum(1 for a, t in zip(am[first: first + len(g)].tolist(), g, strict=True) if a != t)
    return out, {"positions": sum(len(g) for g in generated), "argmax_differs_from_decoded": differ,
                 "column": f"generations.{TEACHER_FORCED_LOGPROB}"}


def answer_columns(tokens: list[int], answer: list[int] | None) -> dict[str, Any]:
    """The sequences table's answer columns for one generated sequence: ``extracted_answer`` (the
    first ``len(answer)`` generated tokens: the answer the model gave) and ``correct`` (it equals the
    expected ``answer`` token for token); both null for a prompt without an expected answer."""
    if answer is None:
        return {"extracted_answer": None, "correct": None}
    extracted = [int(t) for t in tokens[: len(answer)]]
    return {"extracted_answer": extracted, "correct": extracted == [int(t) for t in answer]}


KIND = Kind(name="generate", version=VERSION, spec=GenerateExperiment,
            tables=("generations", "sequences", "arm_runs"), describe=describe, run=run, expand=expand,
            problems=problems, resolve=resolve_model_and_prompts, doc=__doc__ or "")
