"""``report localize``: where two kernels make a greedy generation part, and the culprit linears."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Report, View, lazy


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import localize as lz

    per_pair = lz.pairs(cat, sweep)
    if not per_pair:
        return View(sweep, [], empty="no localize results yet")
    per_prompt = lz.prompts(cat, sweep)
    blocks = [
        Block("first divergence and culprit sets per arm pair (A is the reference)", lz.pair_table(per_pair),
              after=["first divergence: the 0-based index of the first generated token that differs between all-A "
                     "and all-B greedy generation of one prompt (batch 1); S: the 1-minimal set of W8A8 linears "
                     "that, alone on kernel B, still diverges from all-A at or before that position (ddmin)"]),
    ]
    named = lz.linear_table(lz.linears(cat, sweep))
    if named:
        blocks.append(Block("how often each linear is named", named))
    table = lz.prompt_table(per_prompt, cat.results)
    blocks.append(Block("diverging prompts", table) if table else
                  Block(lines=["no prompt diverged: all-A and all-B generated the same tokens for every prompt"]))
    return View(sweep, per_prompt, blocks)


REPORT = Report(
    name="localize",
    order=125,
    question="Where do two kernels make a generation part, and which linears make it?",
    query="localize_pairs",
    help="""Localization (the `localize` kind): per arm pair, the prompts whose greedy generations part,
where, and the minimal set of linears whose kernel swap still makes them part.

One line per arm pair: prompts that diverged within max_new_tokens, the first-divergence positions
(min / median / max and all of them), the culprit-set sizes found by delta debugging, and the
verification counts (S alone on kernel B diverges; none swapped reproduces all-A; removing any one
linear of S no longer diverges), the prompts whose first differing linear (output hashes,
teacher-forced on the same prefix) is in S, and the replay artifacts that reproduced byte for byte.
Then how often each linear is named, and one line per diverging prompt with the `swapcheck check
replay` command of its culprit artifact. JSON and CSV: one object per (pair, prompt).""",
    example="swapcheck report localize --results results --sweep localize-demo",
    build=_build,
    answer=lazy("reports.localize:answer"),
    columns={"first divergence": "generated-token index (0-based)",
             "search generations": "greedy generations of one prompt run by ddmin"},
)
