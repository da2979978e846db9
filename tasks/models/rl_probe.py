"""The RL-metric semantics probe (``swapcheck check rl-metrics``; docs/rl-metrics.md).

What a probs_diff, k3 or importance-ratio number measures depends on three choices that the number
itself does not show. This probe pins each one down and fails loudly where a figure cannot be trusted:

1. **Null controls** (:func:`tasks.numerics.rl_metrics.null_controls`): identical log-probabilities
   -- planted rows with masked (``-inf``) tokens, in float64, float32, bfloat16 and float16, and one
   engine's own log-probabilities scored twice (an aligned stack) -- must give an importance ratio of
   exactly 1 and k1, k2, k3 and the exact KL of exactly 0, bit for bit. Anything else is INCORRECT.
2. **Raw or processed** (:func:`classify`): for each sampling setting (temperature, top-p, top-k), the
   log-probability the engine returned for each generated token is compared with the raw
   ``log_softmax(logits)`` and with the processed log-probability of the renormalised sampling
   distribution, both from the same sequence's teacher-forced logits. The CPU engine returns its
   *decode* pass's logits over the whole vocabulary (``generate(top_k=V)``); the reference logits come
   from a separate teacher-forced pass. An engine whose values match neither, or raw under one setting
   and processed under another, is INCONCLUSIVE: no figure says what it measures.
3. **Aggregation and direction** (:func:`figures`): with a second arm (another kernel), the k3 and KL
   means three ways (token-mean, sequence-mean, sequence-sum), the importance ratio three ways, and the
   exact KL in both directions -- reported, with the one ``report divergence`` uses named.

The CPU engine decodes greedily and takes no temperature, top-p or top-k (its ``top_k`` is how many
logits it records): its log-probabilities are raw whatever setting a caller has in mind, and the probe
measures that rather than assuming it. :func:`from_vllm_outputs` classifies a vLLM engine's sampled
log-probabilities from its ``RequestOutput`` objects (attribute access only: vLLM is not imported);
:func:`vllm_logprobs` runs one on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from swapcheck_common.errors import InputError
from tasks.numerics.rl_metrics import Sampling
from tasks.verdicts import Verdict, worst

__all__ = ["DEFAULT_SETTINGS", "ProbeInputError", "ProbeResult", "classify", "conclude", "cpu_logprobs", "figures", "from_vllm_outputs",
           "run_rl_probe", "vllm_logprobs"]

#: The settings probed by default: each processor alone and all three together.
DEFAULT_SETTINGS = (Sampling(temperature=0.7), Sampling(top_p=0.9), Sampling(top_k=20),
                    Sampling(temperature=0.7, top_p=0.9, top_k=20))


class ProbeInputError(InputError):
    """A model, kernel or sampling setting the probe cannot run (the CLI exits 2; nothing ran)."""


def _build(model: str, kernel: str, seed: int) -> Any:
    from tasks.models import build_model

    try:
        return build_model(model, kernel=kernel, seed=seed)
    except InputError:
        raise
    except ValueError as exc:  # an unknown model name or a directory that is not a checkpoint
        raise ProbeInputError(str(exc)) from exc


def _max_gap(a: Any, b: Any) -> float:
    """Largest ``|a - b|``, 0 where both are the same (``-inf`` included), inf where one is ``-inf``."""
    import torch

    same = a == b
    gap = torch.where(same, torch.zeros((), dtype=a.dtype), (a - b).abs())
    gap = torch.where(torch.isnan(gap) & ~same, torch.full((), float("inf"), dtype=a.dtype), gap)
    return float(gap.max()) if gap.numel() else 0.0


def classify(returned: Any, logits: Any, tokens: Any, sampling: Sampling, atol: float = 0.0) -> dict[str, Any]:
    """Which log-probabilities ``returned`` (``[P]``, float64) are, given the teacher-forced ``logits``
    (``[P, V]``) of the same positions and the ``tokens`` (``[P]``) they score: ``raw``, ``processed``
    (under ``sampling``), ``indistinguishable`` (both match: a neutral setting, or one that changed
    none of these tokens' values) or ``neither``. A match is ``max |returned - reference| <= atol``
    (0: bit for bit)."""
    import torch

    from tasks.numerics import rl_metrics as m

    got = torch.as_tensor(returned).to(torch.float64)
    raw = m.token_logprobs(m.raw_logprobs(logits), tokens)
    processed = m.token_logprobs(m.processed_logprobs(logits, sampling), tokens)
    gap_raw, gap_processed = _max_gap(got, raw), _max_gap(got, processed)
    is_raw, is_processed = gap_raw <= atol, gap_processed <= atol
    semantics = ("indistinguishable" if is_raw and is_processed else "raw" if is_raw else
                 "processed" if is_processed else "neither")
    return {"setting": sampling.label(), "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "positions": int(got.numel()), "max_gap_raw": gap_raw,
            "max_gap_processed": gap_processed, "atol": atol, "semantics": semantics}


def conclude(rows: Sequence[dict[str, Any]]) -> tuple[str, Verdict]:
    """One line for the engine from :func:`classify`'s rows: ``raw``, ``processed (temperature T,
    top-p P)`` (the settings where it was seen), or why it cannot be said (INCONCLUSIVE)."""
    decisive = [r for r in rows if r["semantics"] in ("raw", "processed", "neither")]
    kinds = {r["semantics"] for r in decisive}
    if not decisive:
        return "undetermined (every setting probed leaves raw and processed equal)", Verdict.INCONCLUSIVE
    if kinds == {"raw"}:
        return "raw", Verdict.IDENTICAL
    if kinds == {"processed"}:
        return "processed (" + "; ".join(r["setting"] for r in decisive) + ")", Verdict.IDENTICAL
    if "neither" in kinds:
        bad = "; ".join(r["setting"] for r in decisive if r["semantics"] == "neither")
        return f"neither raw nor processed under {bad}", Verdict.INCONCLUSIVE
    return "inconsistent (raw under some settings, processed under others)", Verdict.INCONCLUSIVE


def cpu_logprobs(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> dict[str, Any]:
    """What the CPU engine returns for its generated tokens, and the teacher-forced logits to judge it:
    ``generate(top_k=V)`` (every logit of the decode pass, ranked), the generated token's
    log-probability ``log_softmax`` over those returned logits; ``forward_tokens`` of each whole
    sequence for the reference logits. ``returned``, ``tokens`` ``[P]``, ``logits`` ``[P, V]``,
    ``lengths`` (generated tokens per sequence)."""
    import numpy as np
    import torch

    vocab = int(model.forward_tokens([list(prompts[0])]).shape[-1])
    gen = model.generate([list(p) for p in prompts], max_new_tokens, top_k=vocab)
    from tasks.numerics import rl_metrics as m

    returned, tokens, logits, lengths = [], [], [], []
    for b, prompt in enumerate(prompts):
        ids = np.asarray(gen.topk_ids[b], dtype=np.int64)  # [T, V]: every token, ranked
        vals = torch.as_tensor(np.asarray(gen.topk_logits[b], dtype=np.float64))
        full = torch.full_like(vals, float("nan")).scatter(1, torch.as_tensor(ids), vals)
        toks = np.asarray(gen.tokens[b], dtype=np.int64)
        returned.append(m.token_logprobs(m.raw_logprobs(full), toks))
        seq = [*prompt, *gen.tokens[b]]
        tf = model.forward_tokens([seq])[0][len(prompt) - 1: len(prompt) - 1 + len(toks)]
        logits.append(tf.to(torch.float64))
        tokens.append(toks)
        lengths.append(len(toks))
    return {"returned": torch.cat(returned), "tokens": np.concatenate(tokens), "logits": torch.cat(logits),
            "lengths": lengths, "sequences": [[*p, *t] for p, t in zip(prompts, gen.tokens, strict=True)]}


def figures(ref_logits: Any, arm_logits: Any, tokens: Any, lengths: Sequence[int]) -> dict[str, Any]:
    """The aggregation and direction figures of one pair on the reference arm's tokens (the reference
    is the sampler q, the arm p): k3 and exact KL three ways, the importance ratio three ways, and the
    exact KL in both directions (token-mean). ``report divergence`` uses token-mean for k3 and KL
    ("mean per position") and sequence-sum for the KL "per sequence"; it computes no ratio."""
    from tasks.numerics import rl_metrics as m

    lq, lp = m.raw_logprobs(ref_logits), m.raw_logprobs(arm_logits)
    tq, tp = m.token_logprobs(lq, tokens), m.token_logprobs(lp, tokens)
    k3, kl_qp, kl_pq = m.k3(tp, tq), m.kl_exact(lq, lp), m.kl_exact(lp, lq)
    agg = {name: {how: m.aggregate(v, lengths, how) for how in m.AGGREGATIONS}
           for name, v in (("k3", k3), ("kl_ref_arm", kl_qp), ("kl_arm_ref", kl_pq))}
    return {"positions": int(k3.numel()), "sequences": len(lengths), **agg,
            "importance_ratio": m.sequence_ratios(tp, tq, lengths),
            "report_divergence_uses": {"k3": "token-mean", "kl_ref_arm": "token-mean (per position) and sequence-sum "
                                       "(per sequence)", "importance_ratio": "not computed"}}


@dataclass
class ProbeResult:
    """The probe's verdict and evidence (JSON: :meth:`to_dict`; text: :meth:`text`)."""

    engine: str
    null_controls: list[dict[str, Any]]
    settings: list[dict[str, Any]]
    semantics: str
    semantics_verdict: Verdict
    pair: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        nulls = Verdict.INCORRECT if any(r["bad"] for r in self.null_controls) else Verdict.IDENTICAL
        return worst([nulls, self.semantics_verdict])

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def to_dict(self) -> dict[str, Any]:
        return {"check": "rl_metrics", "engine": self.engine, "verdict": self.verdict.value, "passed": self.passed,
                "engine_logprobs": self.semantics, "null_controls": self.null_controls, "settings": self.settings,
                "pair": self.pair, "notes": self.notes}

    def text(self) -> str:
        failed = [r for r in self.null_controls if r["bad"]]
        lines = [f"rl-metrics probe: {self.engine}",
                 f"null controls: {len(self.null_controls) - len(failed)} of {len(self.null_controls)} exact "
                 "(identical log-probabilities: importance ratio 1, k1/k2/k3/KL 0, bit for bit)"]
        lines += [f"  FAILED {r['source']} {r['dtype']} {r['figure']}: {r['bad']} of {r['values']} values are not "
                  f"{r['expected']:g} (e.g. {r['worst']!r})" for r in failed]
        lines.append(f"engine logprobs: {self.semantics}")
        for r in self.settings:
            lines.append(f"  {r['setting']}: {r['semantics']} (max |returned - raw| {r['max_gap_raw']:.3g}, "
                         f"max |returned - processed| {r['max_gap_processed']:.3g}, {r['positions']} tokens)")
        if self.pair:
            p = self.pair
            lines.append(f"pair {p['ref_arm']} -> {p['arm']} ({p['positions']} tokens, {p['sequences']} sequences; "
                         "the reference arm's tokens, so the reference is the sampler):")
            for name in ("k3", "kl_ref_arm", "kl_arm_ref"):
                lines.append(f"  {name}: " + ", ".join(f"{how} {v:.3g}" for how, v in p[name].items()))
            lines.append("  importance ratio p_arm/p_ref: " + ", ".join(f"{k} {v:.6g}" for k, v in p["importance_ratio"].items()))
            lines.append("  report divergence uses: k3 token-mean; KL token-mean (per position) and sequence-sum "
                         "(per sequence); no importance ratio")
        lines += self.notes
        lines.append(f"verdict: {self.verdict.value} ({'pass' if self.passed else 'FAIL'})")
        return "\n".join(lines)


def _planted_logprobs(seed: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, 257, generator=g, dtype=torch.float64) * 4
    return torch.log_softmax(logits, dim=-1).masked_fill(logits < -6, float("-inf"))  # masked tokens too


def run_rl_probe(model: str = "tiny-qwen3", kernel: str = "int8-cutlass-order", arm_kernel: str | None = "int8-triton-order",
                 settings: Sequence[Sampling] = DEFAULT_SETTINGS, prompts: int = 4, max_new_tokens: int = 16,
                 seed: int = 0) -> ProbeResult:
    """The whole probe on the CPU engine (module docstring): ``model`` with ``kernel``; the pair
    figures against ``arm_kernel`` (None: none)."""
    import torch

    from tasks.numerics import rl_metrics as m

    if prompts < 1 or max_new_tokens < 1:
        raise ProbeInputError(f"prompts {prompts} and max_new_tokens {max_new_tokens}: both must be >= 1")
    nulls = [dict(r, source="planted") for r in m.null_controls(_planted_logprobs(seed))]
    eng = _build(model, kernel, seed)
    g = torch.Generator().manual_seed(seed)
    vocab = int(eng.forward_tokens([[1]]).shape[-1])
    ps = [[int(t) for t in torch.randint(3, vocab, (6,), generator=g)] for _ in range(prompts)]
    got = cpu_logprobs(eng, ps, max_new_tokens)
    again = cpu_logprobs(eng, ps, max_new_tokens)  # the same engine twice: an aligned stack
    nulls += [dict(r, source="engine") for r in m.null_controls(m.raw_logprobs(got["logits"]), dtypes=("float64",))]
    ratio = m.importance_ratio(again["returned"], got["returned"])
    nulls.append({"source": "engine twice", "dtype": "float64", "figure": "importance_ratio (returned)",
                  "expected": 1.0, "values": int(ratio.numel()), "bad": int((ratio != 1).sum()),
                  "worst": None if bool((ratio == 1).all()) else float(ratio[ratio != 1][0])})
    rows = [classify(got["returned"], got["logits"], got["tokens"], s) for s in settings]
    semantics, verdict = conclude(rows)
    notes = [f"{model}, kernel {kernel}: the CPU engine decodes greedily and takes no temperature, top-p or top-k; "
             "'returned' is log_softmax over the logits its decode pass returns (generate(top_k=V)), the references "
             "come from a teacher-forced pass over each whole sequence"]
    pair = None
    if arm_kernel is not None:
        arm = _build(model, arm_kernel, seed)
        arm_logits = torch.cat([arm.forward_tokens([seq])[0][len(p) - 1: len(p) - 1 + n].to(torch.float64)
                                for seq, p, n in zip(got["sequences"], ps, got["lengths"], strict=True)])
        pair = {"ref_arm": kernel, "arm": arm_kernel,
                **figures(got["logits"], arm_logits, got["tokens"], got["lengths"])}
    return ProbeResult(f"cpu ({model}, {kernel})", nulls, rows, semantics, verdict, pair, notes)


# --- vLLM ------------------------------------------------------------------------------------------------------------

def from_vllm_outputs(generated: Sequence[Any], scored: Sequence[Any], sampling: Sampling,
                      atol: float = 1e-3) -> dict[str, Any]:
    """:func:`classify` of a vLLM engine's sampled log-probabilities. ``generated``: the
    ``RequestOutput`` s of ``SamplingParams(temperature, top_p, top_k, logprobs=0)`` (each generated
    token's ``Logprob.logprob``: what ``logprobs_mode`` makes it); ``scored``: the ``RequestOutput`` s
    of each prompt + generated sequence with ``prompt_logprobs`` over the whole vocabulary (raw and
    processed prompt log-probabilities are the same in vLLM: docs/reference/vllm-kernels.md §5), the
    reference distribution. ``atol`` 1e-3 nats: a decode step and a prefill are different GPU
    computations, so bit equality is not expected (the gaps are reported)."""
    import numpy as np
    import torch

    returned, tokens, rows = [], [], []
    for gen, sc in zip(generated, scored, strict=True):
        out = gen.outputs[0]
        n_prompt = len(gen.prompt_token_ids)
        for i, tok in enumerate(out.token_ids):
            returned.append(float(out.logprobs[i][tok].logprob))
            tokens.append(int(tok))
            entry = sc.prompt_logprobs[n_prompt + i]  # scores sequence token n_prompt + i
            vocab = max(entry) + 1
            row = torch.full((vocab,), float("-inf"), dtype=torch.float64)
            for t, lp in entry.items():
                row[t] = float(lp.logprob)
            rows.append(row)
    width = max(r.numel() for r in rows)
    logits = torch.stack([torch.cat([r, torch.full((width - r.numel(),), float("-inf"), dtype=torch.float64)])
                          for r in rows])
    return classify(torch.tensor(returned, dtype=torch.float64), logits, np.asarray(tokens), sampling, atol)


def vllm_logprobs(llm: Any, prompts: Sequence[Sequence[int]], sampling: Sampling, max_new_tokens: int = 16,
                  seed: int = 0) -> dict[str, Any]:  # pragma: no cover - needs a GPU and vLLM
    """Sample from ``llm`` (a ``vllm.LLM`` built with ``max_logprobs=-1`` and the ``logprobs_mode``
    under test) with ``sampling``, score the sequences teacher-forced over the whole vocabulary, and
    :func:`from_vllm_outputs`."""
    import vllm

    gen_params = vllm.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                                     top_k=sampling.top_k if sampling.top_k > 0 else -1, max_tokens=max_new_tokens,
                                     logprobs=0, seed=seed, ignore_eos=True, detokenize=False)
    generated = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], gen_params)
    seqs = [[*g.prompt_token_ids, *g.outputs[0].token_ids] for g in generated]
    scored = llm.generate([{"prompt_token_ids": s} for s in seqs],
                          vllm.SamplingParams(max_tokens=1, prompt_logprobs=-1, detokenize=False))
    return from_vllm_outputs(generated, scored, sampling)
