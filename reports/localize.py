"""Where two kernels make a generation part: the tables of ``report localize``.

Every number comes from the named queries ``localize_pairs`` (one row per arm pair),
``localize_linears`` (one row per pair and linear named) and ``localize_prompts`` (one row per pair
and prompt); docs/localize.md says what each figure is and how the ``localize`` kind computes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["answer", "linear_table", "linears", "pair_table", "pairs", "prompt_table", "prompts"]


def pairs(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("localize_pairs", sweep=sweep)


def linears(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("localize_linears", sweep=sweep)


def prompts(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("localize_prompts", sweep=sweep)


def _of(n: Any, d: Any) -> str:
    return f"{n}/{d}"


def pair_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per arm pair: prompts that diverged, where, the culprit sizes and the verification."""
    out = []
    for r in rows:
        d = r["diverged"]
        positions = r["first_divergences"] or []
        out.append({
            "experiment": r["experiment"], "pair (A~B)": r["pair"], "kernels": f"{r['kernel_a']} ~ {r['kernel_b']}",
            "scales": r["scales"], "diverged / prompts": _of(d, r["prompts"]),
            "within tokens": r["max_new_tokens"],
            "first divergence min / median / max": "-" if not d else
            f"{r['first_divergence_min']} / {r['first_divergence_median']:g} / {r['first_divergence_max']}",
            "first divergences (sorted)": ", ".join(str(p) for p in positions) or "-",
            "culprit sizes": ", ".join(str(s) for s in (r["culprit_sizes"] or [])) or "-",
            "S on B diverges": _of(r["culprit_diverges"], d), "none swapped identical": _of(r["none_identical"], d),
            "1-minimal": _of(r["one_minimal"], d), "first differing linear in S": _of(r["first_diff_in_culprit"], d),
            "artifacts reproduced": _of(r["artifacts_reproduced"], r["artifacts"]),
            "search generations (total / median)": "-" if not d else
            f"{r['bisection_generations'] or 0} / {(r['bisection_generations_median'] or 0):g}",
            "errors": r["errors"],
        })
    return out


def linear_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (pair, linear): in how many culprit sets it is (alone), how often it differs first."""
    return [{"experiment": r["experiment"], "pair (A~B)": r["pair"], "linear": r["linear"],
             "in culprit sets": r["in_culprit"], "as the whole set": r["alone"],
             "first differing linear": r["first_diff"]} for r in rows]


def prompt_table(rows: list[dict[str, Any]], root: str | None = None) -> list[dict[str, Any]]:
    """One line per diverging (or failed) prompt: position, tokens, margin, first differing linear and
    layer, the culprit set with its verification, and the command that replays its artifact."""
    out = []
    for r in rows:
        if r["first_divergence"] is None and r["error"] is None:
            continue
        path = r["artifact"]
        if path is not None and root is not None:
            path = f"{root.rstrip('/')}/{path}"
        flags = [name for name, ok in (("diverges", r["verified_culprit_diverges"]),
                                       ("none identical", r["verified_none_identical"]),
                                       ("1-minimal", r["verified_one_minimal"])) if ok]
        out.append({
            "experiment": r["experiment"], "pair (A~B)": r["pair"], "prompt": r["prompt_index"],
            "first divergence": r["first_divergence"],
            "token A / B": "-" if r["token_a"] is None else f"{r['token_a']} / {r['token_b']}",
            "A's top-1 - top-2 margin there": "-" if r["margin_a"] is None else f"{r['margin_a']:.4g}",
            "first differing linear": r["first_diff_linear"] or "-",
            "first differing layer": "-" if r["first_diff_layer"] is None else r["first_diff_layer"],
            "linears differing": "-" if r["linears_hashed"] is None else f"{r['linears_differing']}/{r['linears_hashed']}",
            "culprit set S": ", ".join(r["culprit"] or []) or "-",
            "S diverges at": "-" if r["culprit_divergence"] is None else r["culprit_divergence"],
            "verified": ", ".join(flags) or "-", "search generations": r["bisection_generations"],
            "artifact reproduced": r["artifact_reproduces"],
            "replay": f"swapcheck check replay {path}" if path else "-",
            "error": r["error"] or "",
        })
    return out


def answer(cat: Catalog, sweep: str) -> str | None:
    """One line per sweep for the summary of ``report all``: per arm pair, the prompts that parted,
    where, and the culprit sets' sizes; the linear named most often."""
    rows = pairs(cat, sweep)
    if not rows:
        return None
    parts = []
    for r in rows:
        d = r["diverged"]
        where = "" if not d else (f", first at generated token {r['first_divergence_min']} "
                                  f"(median {r['first_divergence_median']:g})")
        sizes = sorted(set(r["culprit_sizes"] or []))
        culprit = "" if not sizes else (f"; minimal culprit sets of {'/'.join(str(s) for s in sizes)} "
                                        f"linear{'s' if sizes != [1] else ''}, {r['one_minimal']}/{d} verified 1-minimal")
        parts.append(f"{r['pair']}: {d}/{r['prompts']} prompts part within {r['max_new_tokens']} tokens{where}{culprit}")
    named = sorted(linears(cat, sweep), key=lambda r: -(r["in_culprit"] or 0))
    most = f"; named most: {named[0]['linear']} ({named[0]['in_culprit']}x)" if named and named[0]["in_culprit"] else ""
    return "; ".join(parts) + most
