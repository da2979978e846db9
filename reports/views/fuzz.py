"""``report fuzz``: what the fuzzing hunts of a sweep found, and how to replay each failure."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Report, View


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import fuzz as fr

    hunts = fr.summary(cat, sweep)
    fails = fr.failures(cat, sweep)
    table = fr.failure_table(fails, cat.results)
    blocks = [Block("fuzzing hunts (one line per kernel)", fr.summary_table(hunts))] if hunts else []
    cover = fr.coverage_table(fr.coverage(cat, sweep)) if hunts else []
    if cover:
        blocks.append(Block("coverage of boundary classes (trials hitting each class; of those, trials that failed)",
                            cover))
    if hunts:
        blocks.append(Block("saved failures", table) if fails else
                      Block(lines=["no failures saved: every trial passed both checks"]))
    return View(sweep, table, blocks, empty=None if hunts else "no fuzz results yet")


REPORT = Report(
    name="fuzz",
    order=120,
    question="What did the fuzzing hunts find, and how is each failure replayed?",
    query="fuzz_summary",
    help="""Fuzzing hunts (the `fuzz` kind): trials per kernel, verdicts, and every saved failure.

One line per hunt (experiment, kernel, output format): trials run, how many trials each check
(exact match on binary inputs, bounds) judged other than IDENTICAL, the worst verdict, failures
saved and kernel errors. Then the coverage table: per hunt and boundary class (K at 2^j-1, 2^j,
2^j+1 for each j reached, or other; K > 4096; M and N at tile sizes 16..256 +-1; N's tail against
16-column tiles; the operand layout) the trials that hit it and how many of those failed. Then one
line per saved failure: the trial, the shape drawn and the
shape it shrank to, the check that failed, the first failing element, and the `swapcheck check
replay` command that reproduces it byte for byte. JSON and CSV: one object per failure.""",
    example="swapcheck report fuzz --results results --sweep fuzz-demo",
    build=_build,
    document=lambda cat, sweep: [],
)
