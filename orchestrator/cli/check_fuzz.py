"""``swapcheck check fuzz`` and ``check replay``: a seeded hunt for failures, and their replay.

Thin over :mod:`tasks.checks.fuzz` and :mod:`tasks.checks.artifact`; runs in this process (no Ray).
``check fuzz`` exits 0 when every trial passed, 1 when one failed (its shrunk artifact is saved),
2 for bad input.  ``check replay`` exits 0 when the recorded failure reproduces byte for byte, 1
when it no longer does, 2 for a bad artifact (the field path is named).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import typer

from orchestrator.cli.check_options import (
    DeviceOpt,
    Dtype,
    DtypeOpt,
    KernelOpt,
    NoUserKernelsOpt,
    OperandsOpt,
    OutFormat,
    ParamOpt,
    out_dtype,
    params,
)
from orchestrator.cli.common import user_errors
from orchestrator.errors import UsageError

__all__ = ["fuzz", "replay", "parse_budget"]

_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|sec|m|min|h)?\s*$", re.IGNORECASE)
_UNIT = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float:
    """``--budget``: seconds as ``90``, ``60s``, ``2m``, ``1.5m`` or ``1h``; must be > 0."""
    match = _BUDGET.match(text)
    if not match:
        raise UsageError(f"--budget {text!r}: expected a duration such as 90, 60s, 2m or 1h")
    seconds = float(match.group(1)) * _UNIT[match.group(2).lower() if match.group(2) else None]
    if seconds <= 0:
        raise UsageError(f"--budget {text!r}: must be more than 0 seconds")
    return seconds


def fuzz(
    kernel: KernelOpt,
    budget: str = typer.Option("60s", "--budget", "-b", help="Time budget: 90, 60s, 2m or 1h (trials run until it is spent)."),
    seed: int = typer.Option(0, "--seed", help="Seed: trial i's shape, recipe, scales and values derive from (seed, i) only."),
    out: Path = typer.Option(Path("fuzz-failures"), "--out", "-o", help="Directory for the failures' artifacts (.safetensors + .json)."),
    max_trials: int = typer.Option(None, "--max-trials", help="Stop after this many trials even if budget is left."),
    max_failures: int = typer.Option(1, "--max-failures", help="Stop after this many failing trials (each shrunk and saved)."),
    algorithm: str = typer.Option("any", "--algorithm", "-a", help="Bounds: any (default), sequential, pairwise, blocked-<b>, exact or slots16."),
    accumulate: str = typer.Option("fp32", "--accumulate", help="Bounds: the algorithm's accumulation format."),
    dtype: DtypeOpt = Dtype.bfloat16,
    operands: OperandsOpt = None,
    device: DeviceOpt = None,
    param: ParamOpt = None,
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
    no_user_kernels: NoUserKernelsOpt = False,
) -> None:
    """Hunt for inputs a kernel gets wrong: shapes at kernel edges (K at every power-of-two boundary
    2^j-1, 2^j, 2^j+1 up to 32,769 and off multiples of 16, 64 and 128; M and N at tile sizes 16..256
    +-1, M = 1, N tails), transposed and strided operand layouts, values that stress rounding
    (outliers along K, mixed-magnitude rows, exact ties, subnormal outputs, the int32 edge of INT8)
    and scales that are and are not powers of two. Each trial is judged by both checks (exact match,
    on binary operands or on cancelling-runs integers whose large partial sums are exact only in
    fp32, and bounds); the output has a coverage table (trials and failures per boundary class); a failure
    is shrunk to the smallest shape that still fails and saved as an artifact that `swapcheck check
    replay` reproduces byte for byte. Exit 1 when a failure is found.

    Example: swapcheck check fuzz --kernel int8-cutlass-order --budget 60s --seed 0 --out fuzz-failures
    """
    with user_errors():
        budget_s = parse_budget(budget)
        if max_failures < 1:
            raise UsageError(f"--max-failures {max_failures}: must be >= 1")
        result = _run(kernel, param, device, operands, no_user_kernels, budget_s, seed, out, max_trials,
                      max_failures, algorithm, accumulate, dtype)  # fmt: skip
    if fmt is OutFormat.json:
        sys.stdout.write(json.dumps(result.to_dict(), default=str) + "\n")
    else:
        typer.echo(result.text())
    raise typer.Exit(0 if result.passed else 1)


def _run(kernel: str, param: list[str] | None, device: str | None, operands: str | None, no_user: bool,
         budget_s: float, seed: int, out: Path, max_trials: int | None, max_failures: int, algorithm: str,
         accumulate: str, dtype: Dtype) -> Any:  # fmt: skip
    from tasks.checks import load_subject
    from tasks.checks.artifact import save_artifact
    from tasks.checks.fuzz import FuzzSettings
    from tasks.checks.fuzz import fuzz as run_fuzz
    from tasks.kernels import user_kernels, user_kernels_enabled

    kparams = params(param)
    with user_kernels(user_kernels_enabled() and not no_user):  # --no-user-kernels, as in `check all`
        subject = load_subject(kernel, kparams, device=device, operands=operands, field="--kernel")
    settings = FuzzSettings(out_dtype(dtype), algorithm, accumulate)

    def save(fail: Any) -> str:
        return str(save_artifact(out, fail, subject, kparams, seed, settings))

    return run_fuzz(subject, budget_s, seed, settings, max_trials=max_trials, max_failures=max_failures,
                    save=save)  # fmt: skip


def replay(
    artifact: Path = typer.Argument(..., help="A .safetensors artifact written by `check fuzz` (or a fuzz sweep), "
                                    "or a culprit artifact of the localize kind."),
    fmt: OutFormat = typer.Option(OutFormat.table, "--format", help="table or json (one JSON object)."),
    no_user_kernels: NoUserKernelsOpt = False,
) -> None:
    """Replay a saved failure: load its operands, scales and recorded output, run the same kernel
    (by the reference and parameters it recorded) and the same check on exactly those operands, in
    the recorded memory layout (contiguous for artifacts that predate layouts), and compare. Exit 0 when the failure reproduces (same verdict, output byte for byte), 1 when it no
    longer does (e.g. the kernel was fixed), 2 for a file that is not a valid artifact. A culprit
    artifact of the `localize` kind (docs/localize.md) re-runs both of its kernels on the operands of
    the culprit linears: exit 0 when both outputs are the recorded bytes.

    Example: swapcheck check replay fuzz-failures/fuzz-exact-match-trial3-1x1026x2.safetensors
    """
    from tasks.checks.artifact import replay as run_replay
    from tasks.kernels import user_kernels, user_kernels_enabled
    from tasks.models.culprit import is_culprit_artifact, replay_culprit

    with user_errors(), user_kernels(user_kernels_enabled() and not no_user_kernels):
        culprit = replay_culprit(artifact) if is_culprit_artifact(artifact) else None  # a localize artifact
        r = run_replay(artifact) if culprit is None else None
    if culprit is not None:
        typer.echo(json.dumps(culprit.to_json(), default=str) if fmt is OutFormat.json else culprit.text())
        raise typer.Exit(0 if culprit.reproduced else 1)
    assert r is not None
    if fmt is OutFormat.json:
        obj = {"artifact": r.artifact, "kernel": r.kernel, "check": r.check, "shape": r.shape,
               "recorded_verdict": r.recorded_verdict, "verdict": r.verdict, "same_output": r.same_output,
               "same_expected": r.same_expected, "reproduced": r.reproduced,
               "recorded_version": r.recorded_version, "version": r.version, "layout": r.layout,
               "layout_recorded": r.layout_recorded, "row": r.judged.result.to_row()}  # fmt: skip
        sys.stdout.write(json.dumps(obj, default=str) + "\n")
    else:
        typer.echo(r.text())
    raise typer.Exit(0 if r.reproduced else 1)
