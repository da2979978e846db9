"""``swapcheck check rl-metrics``: what an RL team's probs_diff, k3 and importance ratio measure.

Thin over :func:`tasks.models.rl_probe.run_rl_probe`; registered on the ``check`` app in
:mod:`orchestrator.cli.check`.  Exit 0 when the verdict passes, 1 when it does not (a null control
that is not exact: INCORRECT; log-probabilities neither raw nor processed: INCONCLUSIVE), 2 for bad
input (an unknown model or kernel, a sampling parameter out of range; nothing is run).
"""

from __future__ import annotations

from typing import Any

import typer

from orchestrator.cli.check_options import OutFormat, run_checks

SETTINGS_HELP = ("Probe one sampling setting instead of the default four (temperature 0.7; top-p 0.9; top-k 20; "
                 "all three): give any of --temperature, --top-p, --top-k.")


def rl_metrics(
    model: str = typer.Option("tiny-qwen3", "--model", help="tiny-qwen3, answer-qwen3 or a checkpoint directory (docs/models.md)."),
    kernel: str = typer.Option("int8-cutlass-order", "--kernel", "-k", help="The engine's INT8 kernel (the reference arm)."),
    arm_kernel: str = typer.Option("int8-triton-order", "--arm-kernel",
                                   help="A second arm for the aggregation and direction figures; 'none' for no pair."),
    temperature: float | None = typer.Option(None, "--temperature", help=SETTINGS_HELP),
    top_p: float | None = typer.Option(None, "--top-p", help="Top-p of the one setting probed (1: off)."),
    top_k: int | None = typer.Option(None, "--top-k", help="Top-k of the one setting probed (0: off)."),
    prompts: int = typer.Option(4, "--prompts", help="Seeded prompts of 6 tokens."),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens", help="Tokens generated per prompt."),
    seed: int = typer.Option(0, "--seed", help="Model weights (tiny-qwen3), prompts and the planted null controls."),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
) -> None:
    """Null controls (identical log-probabilities must give an importance ratio of exactly 1 and
    k1/k2/k3/KL of exactly 0, in four dtypes and on the engine scored twice), whether the engine's
    log-probabilities are raw or processed (temperature, top-p, top-k renormalised), and a kernel pair's
    k3, KL and importance ratio aggregated three ways with the KL in both directions (docs/rl-metrics.md).

    Example: swapcheck check rl-metrics --model answer-qwen3 --temperature 0.6 --top-p 0.95
    """

    def go() -> list[Any]:
        from tasks.models.rl_probe import DEFAULT_SETTINGS, ProbeInputError, run_rl_probe
        from tasks.numerics.rl_metrics import Sampling

        settings: tuple[Sampling, ...] = DEFAULT_SETTINGS
        if temperature is not None or top_p is not None or top_k is not None:
            try:
                one = Sampling(1.0 if temperature is None else temperature, 1.0 if top_p is None else top_p,
                               0 if top_k is None else top_k)
            except ValueError as exc:
                raise ProbeInputError(str(exc)) from exc
            if one.temperature == 0:
                raise ProbeInputError("--temperature 0 is greedy: no sampling distribution to compare with")
            settings = (one,)
        return [run_rl_probe(model, kernel, None if arm_kernel == "none" else arm_kernel, settings, prompts,
                             max_new_tokens, seed)]

    run_checks(go, fmt)
