"""What a check reports: per-trial evidence, the aggregate verdict, JSON and a readable text.

A :class:`CheckResult` holds one :class:`TrialResult` per (shape, input kind, trial).  Its verdict
is the most severe of its trials' (:func:`tasks.verdicts.worst`).  The evidence of a trial is its
counts (positions, checked, mismatches, differing) and two :class:`Element` s: the first mismatch
in row-major order and the worst (largest distance in output spacings), each with its indices, the
exact value, what a correct kernel must return there and what the kernel returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tasks.verdicts import Verdict, worst

__all__ = [
    "Element",
    "TrialResult",
    "Judged",
    "CheckResult",
    "ROW_COLUMNS",
    "INFO_COLUMNS",
    "element",
    "combined",
    "format_number",
]


def format_number(v: float | None) -> str:
    """Integers as integers, other values with 9 significant digits (enough for fp32)."""
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if float(v).is_integer() and abs(v) < 2**53:
        return str(int(v)) if v != 0 or math.copysign(1.0, v) > 0 else "-0"
    return f"{v:.9g}"


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass
class Element:
    """One output element, as evidence.

    Attributes:
        row, col: its indices in the ``[M, N]`` output.
        exact: the exact value of the output (exact for the binary check; the exact result within
            one float64 spacing for the bounds check).
        expected: what a correct kernel returns there (exact match: the exact value, representable
            in the output format; bounds: the exact value rounded once to the output format).
        observed: what the kernel returned.
        spacings: distance of ``observed`` from ``expected`` in output spacings (-1: a NaN is
            involved); None when the output is not in the check's format.
        low, high: (bounds) the outputs the algorithm's bound allows, in the output format.
    """

    row: int
    col: int
    exact: float | None
    expected: float | None
    observed: float | None
    spacings: int | None = None
    low: float | None = None
    high: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "row": self.row, "col": self.col, "exact": self.exact, "expected": self.expected,
            "observed": self.observed, "spacings": self.spacings, "low": self.low, "high": self.high,
        }  # fmt: skip

    def describe(self) -> str:
        """``C[i, j]: exact 112, observed 113 (1 spacing)`` (plus the allowed range for bounds)."""
        text = f"C[{self.row}, {self.col}]: exact {format_number(self.exact)}"
        if self.expected is not None and self.expected != self.exact:
            text += f" (rounded once: {format_number(self.expected)})"
        if self.low is not None and self.high is not None:
            text += f", allowed [{format_number(self.low)}, {format_number(self.high)}]"
        text += f", observed {format_number(self.observed)}"
        if self.spacings is not None and self.spacings != 0:
            text += " (NaN)" if self.spacings < 0 else (
                f" ({self.spacings} spacing{'s' if self.spacings != 1 else ''})"
            )
        return text


def element(
    index: int,
    n: int,
    exact: np.ndarray,
    expected: np.ndarray,
    observed: np.ndarray,
    spacings: np.ndarray | None = None,
    low: np.ndarray | None = None,
    high: np.ndarray | None = None,
) -> Element:
    """The :class:`Element` at flat ``index`` of ``[M, N]`` arrays (N = ``n``)."""
    i, j = divmod(int(index), n)
    idx = (i, j)
    return Element(
        i, j, _num(exact[idx]), _num(expected[idx]), _num(observed[idx]),
        None if spacings is None else int(spacings[idx]),
        None if low is None else _num(low[idx]), None if high is None else _num(high[idx]),
    )  # fmt: skip


#: Check-specific facts a trial records (TrialResult.info), each a column of its row.
INFO_COLUMNS = (
    "p", "limit", "inputs", "algorithm", "output_dtype", "scales", "scale_a_numel", "scale_b_numel",
    "nan_mismatches", "problem",
)  # fmt: skip
_ELEMENT_KEYS = ("row", "col", "exact", "expected", "observed", "spacings", "low", "high")
#: The columns of a trial's row, in order (the ``exact_match`` and ``bounds`` tables).
ROW_COLUMNS = (
    "check", "m", "k", "n", "trial", "seed", "verdict", "positions", "checked", "mismatches",
    "differing", "max_spacing", "error", "seconds", *INFO_COLUMNS,
    *(f"first_{k}" for k in _ELEMENT_KEYS), *(f"worst_{k}" for k in _ELEMENT_KEYS),
)  # fmt: skip


@dataclass
class TrialResult:
    """One trial: one draw of operands for one shape (and input kind), judged.

    Attributes:
        check: "exact_match" or "bounds".
        m, k, n: the problem.
        trial: the trial's index; ``seed`` the base seed it was drawn from.
        verdict: this trial's verdict.
        positions: outputs in all (M * N).
        checked: outputs judged (exact match: those whose reference is in the exact range; bounds:
            all of them).
        mismatches: judged outputs that fail (not equal / outside the bound).
        differing: outputs that differ from the exact value rounded once (bounds; for exact match
            the same as mismatches).
        max_spacing: the largest such distance in output spacings (None if not measurable).
        first, worst: evidence elements (None when nothing differs).
        info: check-specific facts (p, limit, inputs kind, scale layout, output dtype, ...).
        error: the kernel's exception, for an ERROR verdict.
        seconds: the kernel's run time.
    """

    check: str
    m: int
    k: int
    n: int
    trial: int
    seed: int
    verdict: Verdict
    positions: int = 0
    checked: int = 0
    mismatches: int = 0
    differing: int = 0
    max_spacing: int | None = None
    first: Element | None = None
    worst: Element | None = None
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.k}x{self.n}"

    def to_row(self) -> dict[str, Any]:
        """A flat row (the sweep task's row; JSON's per-trial entries), always the columns of
        :data:`ROW_COLUMNS` in that order (None where a column does not apply)."""
        row: dict[str, Any] = {
            "check": self.check, "m": self.m, "k": self.k, "n": self.n, "trial": self.trial,
            "seed": self.seed, "verdict": self.verdict.value, "positions": self.positions,
            "checked": self.checked, "mismatches": self.mismatches, "differing": self.differing,
            "max_spacing": self.max_spacing, "error": self.error, "seconds": self.seconds,
        }  # fmt: skip
        row.update({key: self.info.get(key) for key in INFO_COLUMNS})
        for label, el in (("first", self.first), ("worst", self.worst)):
            for key, value in (el.to_dict() if el else Element(0, 0, None, None, None).to_dict()).items():
                row[f"{label}_{key}"] = value if el else None
        extra = sorted(set(self.info) - set(INFO_COLUMNS))
        if extra:
            raise KeyError(f"trial info keys without a column: {extra}")
        return row


@dataclass
class Judged:
    """One judged run of a kernel, with the arrays behind the verdict (what a fuzz artifact keeps).

    Attributes:
        result: the trial's verdict and evidence.
        output: the kernel's output as returned (on the CPU); None when the kernel raised.
        expected: what a correct kernel returns, float64 ``[M, N]`` (exact match: the exact value;
            bounds: the exact result rounded once to the output format).
        exact: the exact result, float64 ``[M, N]`` (bounds: within one float64 spacing).
    """

    result: TrialResult
    output: Any
    expected: np.ndarray | None
    exact: np.ndarray | None


@dataclass
class CheckResult:
    """All trials of one check of one kernel.

    Attributes:
        check: "exact_match" or "bounds".
        kernel: the kernel reference as given.
        subject: a one-line description of the kernel and how it was called.
        dtype: the output format's name (bf16, fp16, fp32).
        trials_per_shape: the number of fresh draws per shape (and per input kind).
        settings: the check's other parameters (p policy, algorithm, scales, seed, ...).
        results: one TrialResult per shape, input kind and trial.
    """

    check: str
    kernel: str
    subject: str
    dtype: str
    trials_per_shape: int
    settings: dict[str, Any] = field(default_factory=dict)
    results: list[TrialResult] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return worst(r.verdict for r in self.results)

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def positions(self) -> int:
        return sum(r.positions for r in self.results)

    @property
    def checked(self) -> int:
        return sum(r.checked for r in self.results)

    @property
    def mismatches(self) -> int:
        return sum(r.mismatches for r in self.results)

    @property
    def differing(self) -> int:
        return sum(r.differing for r in self.results)

    @property
    def min_checked_fraction(self) -> float:
        fr = [r.checked / r.positions for r in self.results if r.positions]
        return min(fr) if fr else 0.0

    def first_failure(self) -> TrialResult | None:
        """The first trial that did not pass (in the order they ran)."""
        return next((r for r in self.results if not r.verdict.passed), None)

    def worst_trial(self) -> TrialResult | None:
        """The trial with the largest distance of any element, failing trials first."""
        cands = [r for r in self.results if r.worst is not None]
        if not cands:
            return None
        return max(cands, key=lambda r: (not r.verdict.passed, _dist(r.worst)))

    def groups(self) -> list[dict[str, Any]]:
        """One summary per (shape, input kind): trials, positions, checked, mismatches, verdict."""
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in self.results:
            key = (r.m, r.k, r.n, r.info.get("inputs"))
            g = out.setdefault(key, {
                "shape": r.shape, "inputs": r.info.get("inputs"), "p": r.info.get("p"),
                "limit": r.info.get("limit"), "trials": 0, "positions": 0, "checked": 0,
                "mismatches": 0, "differing": 0, "max_spacing": None, "verdicts": [],
                "min_checked_fraction": 1.0, "seconds": 0.0,
            })  # fmt: skip
            g["trials"] += 1
            g["positions"] += r.positions
            g["checked"] += r.checked
            g["mismatches"] += r.mismatches
            g["differing"] += r.differing
            g["seconds"] += r.seconds
            if r.positions:
                g["min_checked_fraction"] = min(g["min_checked_fraction"], r.checked / r.positions)
            if r.max_spacing is not None:
                g["max_spacing"] = max(g["max_spacing"] or 0, r.max_spacing)
            g["verdicts"].append(r.verdict)
        rows = []
        for g in out.values():
            g["verdict"] = worst(g.pop("verdicts")).value
            rows.append(g)
        return rows

    def to_dict(self, trials: bool = True) -> dict[str, Any]:
        """The JSON object: verdict, trials, checked, mismatches, evidence, per-group summaries."""
        fail = self.first_failure()
        wt = self.worst_trial()
        d: dict[str, Any] = {
            "check": self.check,
            "kernel": self.kernel,
            "subject": self.subject,
            "dtype": self.dtype,
            "verdict": self.verdict.value,
            "passed": self.passed,
            "trials": self.trials_per_shape,
            "runs": len(self.results),
            "positions": self.positions,
            "checked": self.checked,
            "checked_fraction": self.checked / self.positions if self.positions else 0.0,
            "min_checked_fraction": self.min_checked_fraction,
            "mismatches": self.mismatches,
            "differing": self.differing,
            "settings": self.settings,
            "groups": self.groups(),
            "first_mismatch": _evidence(fail, fail.first if fail else None),
            "worst": _evidence(wt, wt.worst if wt else None),
            "error": fail.error if fail is not None else None,
        }
        if trials:
            d["trial_rows"] = [r.to_row() for r in self.results]
        return d

    def text(self) -> str:
        """The report a person reads: what was checked, how many positions, the verdict, and for
        a failure the first mismatching element with its exact and observed values."""
        lines = [f"{self.check.replace('_', '-')} check of {self.subject}, output {self.dtype}"]
        for key, value in self.settings.items():
            if key.startswith("about_"):
                lines.append(f"  {value}")
        lines.append(f"  {self.trials_per_shape} fresh draw(s) per shape; base seed {self.settings.get('seed')}")
        lines.append("")
        groups = self.groups()
        has_p = any(g["p"] is not None for g in groups)
        has_inputs = any(g["inputs"] is not None for g in groups)
        header = ["shape MxKxN"] + (["p"] if has_p else []) + (["inputs"] if has_inputs else [])
        header += ["trials", "positions", "checked", "mismatches"]
        header += ["differing", "max spacings"] if self.check == "bounds" else []
        header += ["verdict"]
        table = [header]
        for g in groups:
            frac = g["checked"] / g["positions"] if g["positions"] else 0.0
            row = [g["shape"]] + ([f"{g['p']:.4f}"] if has_p else [])
            row += [str(g["inputs"])] if has_inputs else []
            row += [str(g["trials"]), str(g["positions"]), f"{g['checked']} ({100 * frac:.1f}%)",
                    str(g["mismatches"])]  # fmt: skip
            if self.check == "bounds":
                row += [str(g["differing"]), "-" if g["max_spacing"] is None else str(g["max_spacing"])]
            row += [g["verdict"]]
            table.append(row)
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        for r in table:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        lines.append("")
        fail = self.first_failure()
        if fail is not None:
            where = f"shape {fail.shape}" + (f", inputs {fail.info['inputs']}" if fail.info.get("inputs") else "")
            where += f", trial {fail.trial}"
            if fail.error:
                lines.append(f"  kernel raised ({where}): {fail.error}")
            elif fail.first is not None:
                label = "first element outside the bound" if self.check == "bounds" else "first mismatch"
                lines.append(f"  {label} ({where}): {fail.first.describe()}")
                if fail.worst is not None and fail.worst != fail.first:
                    lines.append(f"  worst element of that trial: {fail.worst.describe()}")
            elif fail.info.get("problem"):
                lines.append(f"  {fail.info['problem']} ({where})")
        elif self.check == "bounds":
            wt = self.worst_trial()
            if wt is not None and wt.worst is not None:
                lines.append(
                    f"  largest difference from the exact result rounded once (shape {wt.shape}, "
                    f"inputs {wt.info.get('inputs')}, trial {wt.trial}): {wt.worst.describe()}"
                )
        total = f"{self.checked} of {self.positions} positions checked, {self.mismatches} mismatch(es)"
        lines.append(f"verdict: {self.verdict.value} ({'pass' if self.passed else 'FAIL'}); {total}")
        return "\n".join(lines)


def _dist(el: Element | None) -> float:
    if el is None or el.spacings is None:
        return -1.0
    return math.inf if el.spacings < 0 else float(el.spacings)


def _evidence(r: TrialResult | None, el: Element | None) -> dict[str, Any] | None:
    if r is None or el is None:
        return None
    return {"shape": r.shape, "m": r.m, "k": r.k, "n": r.n, "trial": r.trial,
            "inputs": r.info.get("inputs"), **el.to_dict()}  # fmt: skip


def combined(results: list[CheckResult]) -> dict[str, Any]:
    """The JSON object of ``check all``: the overall verdict and each check's object."""
    v = worst(r.verdict for r in results)
    return {
        "check": "all",
        "kernel": results[0].kernel if results else None,
        "verdict": v.value,
        "passed": v.passed,
        "trials": max((r.trials_per_shape for r in results), default=0),
        "positions": sum(r.positions for r in results),
        "checked": sum(r.checked for r in results),
        "mismatches": sum(r.mismatches for r in results),
        # what the checks could not see (a verdict of IDENTICAL says nothing about it)
        "cannot_see": list(dict.fromkeys(str(r.settings["about_blind_spot"]) for r in results
                                         if r.settings.get("about_blind_spot"))),
        "checks": [r.to_dict() for r in results],
    }
