"""The flip-risk model: how well the reference arm's logit margin predicts a teacher-forced flip.

Input: the ``teacher_forced`` table (one row per scored position: the reference arm's margin
``ref_margin`` = top-1 minus top-2 logit, and ``flip`` = the other arm's argmax differs), pulled with
DuckDB through the named query ``flip_positions``. Every figure is computed **per (sweep, ref_arm,
arm) pair**: arm pairs are never pooled (a pair with no flips would dilute another pair's rate, and
the margin-to-flip relation of one pair of kernels says nothing about another's). ``flip_report``
returns ``{"filters", "pairs", "notes"}`` with one ``analyze`` object per pair in ``pairs`` and no
figure at the top level; ``analyze`` refuses data holding more than one pair. Per pair, all plain
JSON-able values:

* ``positions``, ``flips``, ``flip_rate``, and ``flip_rate_ci``: the exact (Clopper-Pearson) 95%
  interval from scipy (``binomtest(k, n).proportion_ci(method="exact")``), over positions treated as
  independent trials (``rate_ci`` says so, with the counts); with no flips, ``rate_ci`` also gives
  the exact one-sided 95% upper bound (the "rule of three", about 3/n);
* ``power``: how many positions it takes to see at least one flip with 95% probability at a given
  rate, n = ceil(log(0.05) / log(1 - p)), for the observed rate, the upper end of its interval and
  ``POWER_RATES``;
* ``auc``: ROC-AUC of the margin as a flip predictor (score = -margin: a smaller margin means more
  risk), with ``auc_ci``, a seeded percentile-bootstrap interval, computed **only** when the pair
  has at least ``AUC_CI_MIN_FLIPS`` flips and ``AUC_CI_MIN_NON_FLIPS`` unflipped positions
  (otherwise ``auc_ci`` is None and ``auc_ci_note`` says "too few flips (3) for an interval: at least
  10 are needed"; a percentile bootstrap over a handful of events gives an interval of false
  precision). The bootstrap resamples whole reference sequences by default (positions of one
  sequence share their context, so they are not independent draws; resampling positions would give
  a too narrow interval; ``ci["sequences"]`` counts them), or positions stratified by class
  (``ci_unit="position"``: every resample keeps the flip count). The sequence bootstrap works on
  per-sequence statistics computed once (the sequences x sequences matrix of flip/non-flip pairs,
  evaluated per chunk of resamples with one triangular matrix product; past ``_PAIR_MATRIX_MAX``,
  sparse counts between consecutive flip margins), and its numbers are those of the plain
  per-position computation, exactly (integers and halves; the same seeded draws);
* ``model``: a logistic regression of flip on ``log10(margin + eps)``. The log, because margins span
  many decades (exact ties at 0 up to several logits) and a flip happens when the kernels' logit
  perturbation exceeds the margin: P(flip | m) is the survival function of a perturbation whose size
  is set by floating-point spacings, i.e. roughly scale-free, so it is close to logistic in log m and
  far from logistic in m. ``eps`` (1e-7, about one fp32 spacing of a logit of 1) keeps exact ties
  finite and moves nothing else. The feature is standardized and lightly L2-regularized (C=1 on one
  standardized feature: negligible at thousands of positions, but finite when flips are perfectly
  separated by margin); coefficients are reported on the unstandardized feature;
* ``calibration``: per margin bin (fixed decades, or quantiles), positions, flips, the observed
  rate with a Wilson 95% interval (statsmodels ``proportion_confint`` when installed, else scipy's
  ``binomtest(...).proportion_ci(method="wilson")``; ``calibration_ci`` names which), and the
  model's mean predicted probability;
* ``concentration``: the margin at or below which 50%, 90% and 99% of flips lie (an observed flip
  margin), with the share of all positions at or below it and the flip rates on either side;
  ``concentration_margin`` is the 90% one.

AUC is invariant under monotone transforms, so it is the AUC of the raw margin and of the fitted
model alike; nothing is fitted for it and there is no train/test question. Degenerate inputs (no
positions, no flips, only flips) give ``None`` with a note, never a made-up number.

**Without waste** (issue #25). DuckDB returns each pair's rows unordered (``flip_pair_positions``:
no global ORDER BY, no numbering join) as Arrow columns read into numpy; ``load`` puts them in one
canonical order, (ref_restart, prompt_index, position), because the logistic fit's and the
calibration's floating-point sums depend on the order (so every number is the one the ordered query
gave). Each pair's margins are sorted once (``_Sorted``), and the AUC (the rank form: flip/non-flip
pairs with the flip at the smaller margin, ties one half, in integers: equal to scikit-learn's
trapezoids to within an ulp or two, which is where the JSON's ``auc`` may differ in its last digit
from earlier versions), the bootstrap and the concentration all read that sort. The logistic fit is
scikit-learn's on the pair's positions: margins are nearly all distinct, so no exact sufficient
statistics exist to fit on instead. scipy and scikit-learn are imported inside the functions that
use them (once per process), never with this module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = [
    "AUC_CI_MIN_FLIPS",
    "AUC_CI_MIN_NON_FLIPS",
    "DECADE_EDGES",
    "EPS",
    "POWER_RATES",
    "FlipData",
    "analyze",
    "auc",
    "bootstrap_auc",
    "calibration",
    "concentration",
    "fit_logistic",
    "flip_report",
    "load",
    "positions_needed",
    "power",
    "rate_interval",
    "wilson_interval",
]

#: Added to margins before the log (keeps exact ties finite).
EPS = 1e-7
#: Fixed margin bin edges (logits): ties and sub-resolution margins, then one bin per decade.
DECADE_EDGES = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, math.inf)
#: An AUC interval needs at least this many flipped positions in the pair ...
AUC_CI_MIN_FLIPS = 10
#: ... and at least this many unflipped ones (below either, ``auc_ci`` is None, with a note).
AUC_CI_MIN_NON_FLIPS = 10
#: Reference flip rates of the power note (besides the observed rate and its upper bound).
POWER_RATES = (1e-3, 1e-4, 1e-5)
#: Flip shares for the concentration table.
CONCENTRATION_SHARES = (0.5, 0.9, 0.99)
#: Elements of one bootstrap chunk (resamples x positions): bounds memory at a few tens of MB.
_CHUNK_ELEMENTS = 4_000_000
#: The sequence bootstrap works on per-sequence sufficient statistics (``_sufficient_statistics``);
#: False: on per-position weights (the reference implementation, same numbers, for the tests).
_SUFFICIENT_STATISTICS = True
#: The sequence bootstrap uses the dense pair matrix (``_pair_matrix``) while it has at most this many
#: elements (128 MB) ...
_PAIR_MATRIX_MAX = 16_000_000
#: ... and at most this many times the pair's positions (a dense product does about that many
#: multiply-adds in the time the sparse statistics take for one); beyond, the sparse statistics.
_PAIR_MATRIX_RATIO = 16
#: The fewest positions in one block of the pair matrix's sorted positions (``_pair_matrix``).
_PAIR_RUN = 64
#: Columns of one tile of the pair matrix's sparse product (``_pair_matrix``).
_PAIR_TILE = 256


class FlipData:
    """Teacher-forced positions: margins, flips, and the sequence and pair each belongs to.

    From ``load``: positions in (pair, ref_restart, prompt_index, position) order; ``sequence``
    numbers the reference sequences (ref_restart, prompt_index) of each pair densely in that order,
    continuing across pairs (a sequence scored against two arms has one number in each pair).

    ``pairs[i]`` is the (sweep, ref_arm, arm) of pair id ``i``; ``pair_dropped[i]`` and
    ``pair_ref_mismatch[i]`` its share of ``dropped`` and ``ref_mismatch`` (see ``load``).
    """

    def __init__(self, margin: Any, flip: Any, sequence: Any = None, pair: Any = None,
                 pairs: list[dict[str, Any]] | None = None, dropped: int = 0, ref_mismatch: int = 0,
                 pair_dropped: list[int] | None = None, pair_ref_mismatch: list[int] | None = None):
        self.margin = np.asarray(margin, dtype=np.float64)
        self.flip = np.asarray(flip, dtype=bool)
        n = self.margin.size
        self.sequence = np.arange(n, dtype=np.int64) if sequence is None else np.asarray(sequence, dtype=np.int64)
        self.pair = np.zeros(n, dtype=np.int64) if pair is None else np.asarray(pair, dtype=np.int64)
        self.pairs = pairs or []
        self.dropped = dropped
        self.ref_mismatch = ref_mismatch
        self.pair_dropped = pair_dropped or [0] * len(self.pairs)
        self.pair_ref_mismatch = pair_ref_mismatch or [0] * len(self.pairs)
        if not (self.flip.size == n == self.sequence.size == self.pair.size):
            raise ValueError("margin, flip, sequence and pair must have the same length")

    def __len__(self) -> int:
        return int(self.margin.size)

    def subset(self, mask: np.ndarray) -> FlipData:
        return FlipData(self.margin[mask], self.flip[mask], self.sequence[mask], self.pair[mask])

    def for_pair(self, pid: int) -> FlipData:
        """The positions of pair ``pid`` alone, with that pair's key and dropped/mismatch counts."""
        if len(self.pairs) == 1 and pid == 0 and not self.pair.any():
            return self
        sel = self.pair == pid
        return FlipData(self.margin[sel], self.flip[sel], self.sequence[sel], np.zeros(int(sel.sum()), np.int64),
                        pairs=[self.pairs[pid]], dropped=self.pair_dropped[pid],
                        ref_mismatch=self.pair_ref_mismatch[pid], pair_dropped=[self.pair_dropped[pid]],
                        pair_ref_mismatch=[self.pair_ref_mismatch[pid]])


def load(cat: Catalog, sweep: str | None = None, ref_arm: str | None = None,
         arm: str | None = None) -> FlipData:
    """Pull (ref_margin, flip) and the sequence/pair ids from ``teacher_forced`` with DuckDB.

    Rows with a missing flag or a missing, non-finite or negative margin are dropped and counted
    (``dropped``); ``ref_mismatch`` counts positions where the reference arm's own argmax is not the
    token it generated (should be 0: teacher forcing reproduces greedy decoding). Both are also
    counted per pair (``pair_dropped``, ``pair_ref_mismatch``). The rows of every selected pair are
    returned together, pairs in (sweep, ref_arm, arm) order; analyse them one pair at a time
    (``for_pair``, ``flip_report``).

    DuckDB returns the rows in no particular order; each pair's are put in one canonical order here
    (ref_restart, prompt_index, position; NULLs last), with numpy, because the logistic fit's and the
    calibration's floating-point sums depend on the order. ``sequence`` numbers the reference
    sequences (ref_restart, prompt_index) of each pair in that order, densely, continuing across pairs.
    Pairs whose keys are all known are read one at a time (``flip_pair_positions``, no numbering
    join); a selection with a NULL key is read whole (``flip_positions``).
    """
    if sweep is not None and ref_arm is not None and arm is not None:
        return _load_pairs(cat, [{"sweep": sweep, "ref_arm": ref_arm, "arm": arm}])
    keys = [{"sweep": k["sweep"], "ref_arm": k["ref_arm"], "arm": k["arm"]}
            for k in cat.named("teacher_forced_pairs", sweep=sweep)
            if (ref_arm is None or k["ref_arm"] == ref_arm) and (arm is None or k["arm"] == arm)]
    if all(None not in k.values() for k in keys):
        return _load_pairs(cat, keys)
    return _from_arrow(cat.named_arrow("flip_positions", sweep=sweep, ref_arm=ref_arm, arm=arm))


def _load_pairs(cat: Catalog, keys: list[dict[str, Any]]) -> FlipData:
    """The pairs of ``keys`` (none NULL), each read alone with ``flip_pair_positions``; pairs without rows
    are left out."""
    parts = []
    for key in keys:
        t = cat.named_arrow("flip_pair_positions", **key)
        if t.num_rows:
            parts.append(_from_arrow(t, key))
    return parts[0] if len(parts) == 1 else _concat(parts)


def _concat(parts: list[FlipData]) -> FlipData:
    """One ``FlipData`` of single-pair parts, in order: pair ids and sequence numbers continue."""
    if not parts:
        return FlipData(np.zeros(0), np.zeros(0, bool))
    offsets = np.cumsum([0] + [int(p.sequence.max()) + 1 if len(p) else 0 for p in parts[:-1]])
    return FlipData(np.concatenate([p.margin for p in parts]), np.concatenate([p.flip for p in parts]),
                    np.concatenate([p.sequence + off for p, off in zip(parts, offsets, strict=True)]),
                    np.concatenate([np.full(len(p), i, np.int64) for i, p in enumerate(parts)]),
                    pairs=[p.pairs[0] for p in parts], dropped=sum(p.dropped for p in parts),
                    ref_mismatch=sum(p.ref_mismatch for p in parts),
                    pair_dropped=[p.dropped for p in parts], pair_ref_mismatch=[p.ref_mismatch for p in parts])


def _numpy(col: Any, dtype: Any, null: Any) -> np.ndarray:
    """An Arrow column as a numpy array of ``dtype``, nulls as ``null`` (vectorized, no Python objects)."""
    return np.asarray(col.fill_null(null).to_numpy(), dtype=dtype) if len(col) else np.zeros(0, dtype=dtype)


def _codes(col: Any) -> tuple[np.ndarray, int]:
    """Order-preserving integer codes 0..size-1 of an integer Arrow column, NULL last (as DuckDB sorts)."""
    values = _numpy(col, np.int64, 0)
    if col.null_count == len(col):
        return np.zeros(values.size, np.int64), 1
    valid = _numpy(col.is_valid(), bool, False) if col.null_count else None
    present = values if valid is None else values[valid]
    lo, hi = int(present.min()), int(present.max())
    if hi - lo <= 4 * values.size + 1024:
        codes, size = values - lo, hi - lo + 2
    else:
        distinct, inverse = np.unique(present, return_inverse=True)
        codes, size = np.zeros(values.size, np.int64), distinct.size + 1
        codes[slice(None) if valid is None else valid] = inverse
    if valid is not None:
        codes[~valid] = size - 1
    return codes, size


def _dense(codes: np.ndarray) -> tuple[np.ndarray, int]:
    distinct, inverse = np.unique(codes, return_inverse=True)
    return inverse.astype(np.int64), int(distinct.size)


def _joined(a: tuple[np.ndarray, int], b: tuple[np.ndarray, int]) -> tuple[np.ndarray, int]:
    """Codes of the pairs (a, b), ordered as a then b (int64: renumbered densely first if needed)."""
    (ca, na), (cb, nb) = a, b
    if na * nb >= 2**62:
        ca, na = _dense(ca)
    if na * nb >= 2**62:
        cb, nb = _dense(cb)
    return ca * nb + cb, na * nb


def _from_arrow(t: Any, key: dict[str, Any] | None = None) -> FlipData:
    """``FlipData`` from the rows of ``flip_positions`` (an Arrow table, with ``pair_id`` and the keys) or of
    ``flip_pair_positions`` (the one pair ``key``), with Arrow and numpy only, in the canonical order."""
    import pyarrow as pa

    n = t.num_rows
    margin = _numpy(t.column("ref_margin").cast(pa.float64()), np.float64, np.nan)
    flip_col = t.column("flip")
    has_flip = _numpy(flip_col.is_valid(), bool, False)
    flip = _numpy(flip_col, bool, False)
    with np.errstate(invalid="ignore"):
        ok = has_flip & np.isfinite(margin) & (margin >= 0)
    mismatch = _numpy(t.column("ref_mismatch"), bool, False)
    if key is None:
        pair_ids = _numpy(t.column("pair_id"), np.int64, 0)
        n_pairs = int(pair_ids.max()) + 1 if n else 0
        ids, first = np.unique(pair_ids, return_index=True)
        keys = dict(zip(ids.tolist(), t.select(["sweep", "ref_arm", "arm"]).take(pa.array(first, pa.int64())).to_pylist(),
                        strict=True))
        pairs = [keys[k] for k in sorted(keys)]
    else:
        pair_ids, n_pairs, pairs = np.zeros(n, np.int64), 1, [dict(key)]
    sequence = _joined(_joined((pair_ids, max(n_pairs, 1)), _codes(t.column("ref_restart"))),
                       _codes(t.column("prompt_index")))
    order_key, _ = _joined(sequence, _codes(t.column("position")))
    keep = None if ok.all() else np.flatnonzero(ok)
    by_key = order_key if keep is None else order_key[keep]
    rows: np.ndarray | None = None  # None: the rows kept are in order already (DuckDB often reads them so)
    if by_key.size > 1 and not bool((by_key[1:] > by_key[:-1]).all()):
        order = np.argsort(by_key, kind="stable")  # a few sorted runs (chunks read in parallel): near linear
        ranked = by_key[order]
        if bool((ranked[1:] == ranked[:-1]).any()):
            # the same position twice: order those by margin and flag too, so that no order is left to chance
            order = np.lexsort((flip if keep is None else flip[keep], margin if keep is None else margin[keep],
                                by_key))
        rows = order if keep is None else keep[order]
    elif keep is not None:
        rows = keep
    if rows is not None:
        margin, flip, seq, pair_of = margin[rows], flip[rows], sequence[0][rows], pair_ids[rows]
    else:
        seq, pair_of = sequence[0], pair_ids
    seq = np.concatenate(([0], np.cumsum(seq[1:] != seq[:-1]))) if seq.size else seq  # dense, in order
    per_pair_dropped = np.bincount(pair_ids[~ok], minlength=n_pairs)
    per_pair_mismatch = np.bincount(pair_ids[mismatch], minlength=n_pairs)
    return FlipData(margin, flip, seq, pair_of, pairs=pairs, dropped=int((~ok).sum()),
                    ref_mismatch=int(mismatch.sum()),
                    pair_dropped=[int(c) for c in per_pair_dropped[:len(pairs)]],
                    pair_ref_mismatch=[int(c) for c in per_pair_mismatch[:len(pairs)]])


# -- AUC ------------------------------------------------------------------------------------------

class _Sorted:
    """One pair's positions sorted by margin, once: the AUC, its bootstrap and the concentration all
    read this one sort. Positions of equal margin may lie in any order: every figure taken from it
    counts whole runs of equal margins (``starts``), so none depends on that order."""

    def __init__(self, margin: np.ndarray, flip: np.ndarray) -> None:
        self.order = np.argsort(margin)
        self.margin = margin[self.order]
        self.flip = flip[self.order]
        n = self.margin.size
        self.starts = np.flatnonzero(np.r_[True, self.margin[1:] != self.margin[:-1]]) if n else np.zeros(0, np.int64)
        self.cum_flips = np.cumsum(self.flip, dtype=np.int64)
        self.n_pos = int(self.cum_flips[-1]) if n else 0
        self.n_neg = n - self.n_pos

    def at_or_below(self, m: float) -> tuple[int, int]:
        """Positions, and flips among them, with margin <= ``m``."""
        n = int(np.searchsorted(self.margin, m, side="right"))
        return n, int(self.cum_flips[n - 1]) if n else 0


def _ranks_auc(s: _Sorted) -> float | None:
    """ROC-AUC of -margin from the sorted margins (the Mann-Whitney form): flip/non-flip pairs with the
    flip at the smaller margin, ties one half, over all pairs; in integers, so exact up to one rounding."""
    if s.n_pos == 0 or s.n_neg == 0:
        return None
    ends = np.r_[s.starts[1:], s.margin.size]
    pos_run = np.diff(np.r_[0, s.cum_flips[ends - 1]])
    neg_run = (ends - s.starts) - pos_run
    neg_above = s.n_neg - np.cumsum(neg_run)
    twice = int(np.dot(pos_run, 2 * neg_above + neg_run))
    return twice / (2 * s.n_pos * s.n_neg)


def auc(margin: np.ndarray, flip: np.ndarray) -> float | None:
    """ROC-AUC of ``-margin`` for ``flip``, or None unless both classes are present.

    The rank (Mann-Whitney) form of one sort: equal to scikit-learn's ``roc_auc_score`` (which sums the
    trapezoids of the ROC curve in floating point) to within a few units in the last place."""
    flip = np.asarray(flip, dtype=bool)
    if flip.size == 0 or flip.all() or not flip.any():
        return None
    return _ranks_auc(_Sorted(np.asarray(margin, dtype=np.float64), flip))


def _weighted_auc(pos_w: np.ndarray, neg_w: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """AUC per row of weights over positions sorted by ascending margin; ties count one half.

    ``pos_w``/``neg_w`` are (resamples, n) weights of flipped/unflipped positions; ``starts`` the
    first index of each run of equal margins. A flip at margin m beats every unflipped position of
    larger margin. Rows without both classes give NaN.
    """
    p = np.add.reduceat(pos_w, starts, axis=1)
    q = np.add.reduceat(neg_w, starts, axis=1)
    n_pos = p.sum(axis=1)
    n_neg = q.sum(axis=1)
    neg_above = n_neg[:, None] - np.cumsum(q, axis=1)
    num = (p * (neg_above + 0.5 * q)).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / (n_pos * n_neg)
    out[(n_pos == 0) | (n_neg == 0)] = np.nan
    return np.asarray(out, dtype=np.float64)


def _sufficient_statistics(margin: np.ndarray, flip: np.ndarray, seq: np.ndarray, n_seq: int) -> tuple[Any, Any, Any]:
    """Per-sequence sufficient statistics of the AUC numerator, as sparse (buckets x sequences) counts.

    ``margin``/``flip``/``seq``: positions sorted by ascending margin, dense sequence ids < ``n_seq``.
    The K distinct flip margins u_1 < ... < u_K cut the non-flips into buckets: ``ties[k, t]`` counts
    the non-flips of sequence t at margin u_k, ``above[k, t]`` those strictly between u_k and u_(k+1)
    (above u_K for the last; non-flips below u_1 beat no flip and are left out); ``flips[k, t]`` counts
    the flips of sequence t at u_k. For sequence counts w, the non-flips strictly above u_k weigh
    R_k = sum_(j >= k) above_j w + sum_(j > k) ties_j w, and the resample's AUC numerator is
    sum_k (flips_k w) (R_k + ties_k w / 2): w_F C w with C[s, t] the flip (in s) / non-flip (in t)
    pairs, the flip at the smaller margin, ties one half, without ever forming C.
    """
    from scipy import sparse

    u = np.unique(margin[flip])
    k = u.size
    pos_m, pos_s = margin[flip], seq[flip]
    neg_m, neg_s = margin[~flip], seq[~flip]
    flips = sparse.csr_matrix((np.ones(pos_m.size), (np.searchsorted(u, pos_m), pos_s)), shape=(k, n_seq))
    at = np.searchsorted(u, neg_m, side="left")
    tie = (at < k) & (u[np.minimum(at, k - 1)] == neg_m)
    ties = sparse.csr_matrix((np.ones(int(tie.sum())), (at[tie], neg_s[tie])), shape=(k, n_seq))
    above_bucket = np.searchsorted(u, neg_m, side="right") - 1  # the last flip margin strictly below
    keep = ~tie & (above_bucket >= 0)
    above = sparse.csr_matrix((np.ones(int(keep.sum())), (above_bucket[keep], neg_s[keep])), shape=(k, n_seq))
    for mat in (flips, ties, above):
        mat.sum_duplicates()
    return flips, ties, above


def _sufficient_numerator(stats: tuple[Any, Any, Any], counts: np.ndarray) -> np.ndarray:
    """The AUC numerator per row of sequence counts (resamples x sequences) from ``_sufficient_statistics``."""
    flips, ties, above = stats
    wt = counts.T
    f = np.asarray(flips @ wt).T  # resamples x buckets
    e = np.asarray(ties @ wt).T
    a = np.asarray(above @ wt).T
    # R_k = sum_(j >= k) a_j + sum_(j > k) e_j: reverse cumulative sums.
    rest = np.cumsum((a + e)[:, ::-1], axis=1)[:, ::-1] - e
    return np.asarray((f * (rest + 0.5 * e)).sum(axis=1), dtype=np.float64)


def _pair_matrix(s: _Sorted, seq: np.ndarray, n_seq: int) -> np.ndarray:
    """2C, C[a, b] the (flip in sequence a, non-flip in sequence b) position pairs with the flip at the
    smaller margin, ties one half (``seq``: each sorted position's sequence, dense ids < ``n_seq``).

    Counted in integers, in three parts over the sorted positions cut into blocks of whole runs of
    equal margins (about ``_PAIR_RUN`` positions, or one longer run alone): pairs in different blocks
    (2 each: per sequence, its flips per block times the non-flips per sequence in later blocks, one
    sparse product), pairs in one block but different runs (2 each: enumerated, at most the block's
    length per flip) and pairs in one run (1 each: per run, flips per sequence times non-flips per
    sequence). Every entry is an integer: exact.
    """
    from scipy import sparse

    n = s.margin.size
    starts = s.starts
    ties = starts.size < n  # else every run is one position
    ends = np.r_[starts[1:], n] if ties else starts + 1
    # blocks: the first run starting in each stretch of ``step`` positions, and every run at least as long;
    # ``step`` balances the pairs enumerated in blocks (flips x step / 2, about 3 times the cost of one
    # element of a block row) against the block rows (positions / step x sequences), and keeps those
    # within _PAIR_MATRIX_MAX elements
    n_flips = max(s.n_pos, 1)
    step = max(_PAIR_RUN, math.isqrt(2 * n * n_seq // (3 * n_flips)), -(-n * n_seq // _PAIR_MATRIX_MAX))
    if ties:
        first = np.searchsorted(starts, np.arange(0, n, step), side="left")  # first run start at or after
        cuts = np.unique(np.r_[starts[first[first < starts.size]], starts[(ends - starts) >= step], n])
    else:
        cuts = np.r_[np.arange(0, n, step), n]
    n_blocks = cuts.size - 1
    fpos, npos = np.flatnonzero(s.flip), np.flatnonzero(~s.flip)
    f_seq, n_seq_of = seq[fpos], seq[npos]
    f_block = np.searchsorted(cuts, fpos, side="right") - 1
    n_block = np.repeat(np.arange(n_blocks), np.diff(np.searchsorted(npos, cuts, side="left")))
    # different blocks: 2 x (flips of a in block q) x (non-flips of b in blocks after q)
    later = np.bincount(n_block * n_seq + n_seq_of, minlength=n_blocks * n_seq).astype(np.int32)  # < positions
    later = later.reshape(n_blocks, n_seq)
    # suffix sums row by row (a cumulative sum down the columns of a C-ordered array is slow), shifted by one
    running = np.zeros(n_seq, np.int64)
    for q in range(n_blocks - 1, -1, -1):
        running, later[q] = running + later[q], running
    # int32 where every count fits (2 x flips of one sequence x non-flips of another < 2^31), else int64
    most = 2 * int(np.bincount(f_seq).max(initial=0)) * int(np.bincount(n_seq_of).max(initial=0))
    small = np.int32 if most < 2**31 else np.int64
    flips_in = sparse.csr_matrix((np.full(fpos.size, 2, small), (f_seq, f_block)), shape=(n_seq, n_blocks))
    twice = np.zeros((n_seq, n_seq), small)
    for c0 in range(0, n_seq if n_blocks else 0, _PAIR_TILE):  # column tiles: the rows read stay in cache
        c1 = min(n_seq, c0 + _PAIR_TILE)
        twice[:, c0:c1] = flips_in @ np.ascontiguousarray(later[:, c0:c1])

    def nonflips_before(p: np.ndarray) -> np.ndarray:
        return np.asarray(p - np.where(p > 0, s.cum_flips[np.maximum(p - 1, 0)], 0), dtype=np.int64)
    # one block, different runs: each flip with the non-flips after its run up to the block's end, 2 each
    f_run = np.searchsorted(starts, fpos, side="right") - 1 if ties else fpos
    _add_range_pairs(twice, f_seq, nonflips_before(ends[f_run]), nonflips_before(cuts[f_block + 1]), n_seq_of, 2)
    if not ties:
        return twice
    # one run: 1 x (flips of a in the run) x (non-flips of b in it), for runs holding both
    flips_per_run = np.diff(np.r_[0, s.cum_flips[ends - 1]])
    mixed = (flips_per_run > 0) & (flips_per_run < ends - starts)
    if mixed.any():
        n_run = np.searchsorted(starts, npos, side="right") - 1
        keep_f, keep_n = mixed[f_run], mixed[n_run]
        phi = sparse.csr_matrix((np.ones(int(keep_f.sum()), np.int64), (f_run[keep_f], f_seq[keep_f])),
                                shape=(starts.size, n_seq))
        psi = sparse.csr_matrix((np.ones(int(keep_n.sum()), np.int64), (n_run[keep_n], n_seq_of[keep_n])),
                                shape=(starts.size, n_seq))
        twice += (phi.T @ psi).toarray()
    return twice


def _folded(twice: np.ndarray) -> np.ndarray:
    """2T from 2C, T upper triangular with w^T T w = w^T C w: T_aa = C_aa, T_ab = C_ab + C_ba (a < b).
    Only the upper triangle is written (the rest is left as allocated: never read), tile by tile, so that
    the transposed reads stay in cache."""
    n = twice.shape[0]
    out = np.empty((n, n))
    b = _PAIR_TILE
    for i in range(0, n, b):
        for j in range(i, n, b):
            np.add(twice[i:i + b, j:j + b], twice[j:j + b, i:i + b].T, out=out[i:i + b, j:j + b], dtype=np.float64)
    out[np.diag_indices(n)] *= 0.5
    return out


def _add_range_pairs(out: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, cols: np.ndarray,
                     weight: int) -> None:
    """out[rows[i], cols[j]] += weight for every j in [lo[i], hi[i]), a bounded number of pairs at a time."""
    lens = np.maximum(hi - lo, 0)
    total = np.cumsum(lens)
    flat = out.reshape(-1)
    n_cols = out.shape[1]
    done = 0
    while done < rows.size:
        # as many rows as keep this batch's pairs near _CHUNK_ELEMENTS (at least one row)
        base = int(total[done - 1]) if done else 0
        stop = max(done + 1, int(np.searchsorted(total, base + _CHUNK_ELEMENTS, side="right")))
        ln = lens[done:stop]
        count = int(ln.sum())
        if count:
            offsets = np.repeat(np.cumsum(ln) - ln - lo[done:stop], ln)
            cells = np.repeat(rows[done:stop] * n_cols, ln) + cols[np.arange(count) - offsets]
            np.add.at(flat, cells, flat.dtype.type(weight))  # the same dtype: ufunc.at's fast loop
        done = stop


def _dense_ids(seq: np.ndarray) -> tuple[np.ndarray, int]:
    """Sequence ids renumbered 0..n-1 in their order (as ``np.unique``'s inverse), cheaply when they
    already are a contiguous range."""
    if seq.size:
        lo = int(seq.min())
        shifted = seq - lo
        if int(shifted.max()) < 4 * seq.size + 1024 and bool(np.bincount(shifted).all()):
            return shifted, int(shifted.max()) + 1
    distinct, inverse = np.unique(seq, return_inverse=True)
    return inverse.astype(np.int64), int(distinct.size)


def _ratio(num: np.ndarray, n_pos: np.ndarray, n_neg: np.ndarray) -> np.ndarray:
    """AUC = numerator / (flips x non-flips) per resample; NaN without both classes."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / (n_pos * n_neg)
    out[(n_pos == 0) | (n_neg == 0)] = np.nan
    return np.asarray(out, dtype=np.float64)


def bootstrap_auc(margin: np.ndarray, flip: np.ndarray, sequence: np.ndarray | None = None, *,
                  resamples: int = 1000, level: float = 0.95, seed: int = 0,
                  unit: str = "sequence") -> dict[str, Any]:
    """Percentile-bootstrap interval of the AUC: ``{"ci": [lo, hi] | None, "used": k, ...}``.

    ``unit="sequence"`` resamples whole sequences (``sequence`` ids; ``sequences`` counts them) with
    replacement, however many there are; resamples that happen to hold no flip or only flips have no
    AUC and are left out (``used`` counts the rest). A resample with sequence counts w has the AUC
    w_F C w / ((w P)(w N)) (C: flip/non-flip pairs between two sequences, the flip at the smaller
    margin, ties one half; P, N: flips and non-flips per sequence). C is computed once
    (``_pair_matrix``) and every chunk of resamples is one dense matrix product with it, while C (rows:
    sequences with a flip, columns: with a non-flip) has at most ``_PAIR_MATRIX_MAX`` elements and
    ``_PAIR_MATRIX_RATIO`` times the positions; beyond that, the numerator comes from per-sequence counts
    in buckets between consecutive distinct flip margins (``_sufficient_statistics``: sparse products,
    whose cost grows with the flips and sequences, not their square). Every term is an integer or a
    half integer, so either way the result equals the per-position computation exactly.
    ``unit="position"`` resamples flipped and unflipped positions separately (stratified), so every
    resample has the observed flip count: each chunk of resamples is a weight matrix over the
    positions sorted by margin, reduced per run of equal margins.
    """
    if unit not in ("sequence", "position"):
        raise ValueError(f"unit {unit!r}: allowed: sequence, position")
    margin = np.asarray(margin, dtype=np.float64)
    flip = np.asarray(flip, dtype=bool)
    if flip.size == 0 or flip.all() or not flip.any() or resamples < 1:
        return _bootstrap(None, sequence, resamples=resamples, level=level, seed=seed, unit=unit)
    return _bootstrap(_Sorted(margin, flip), sequence, resamples=resamples, level=level, seed=seed, unit=unit)


def _bootstrap(s: _Sorted | None, sequence: np.ndarray | None, *, resamples: int, level: float, seed: int,
               unit: str) -> dict[str, Any]:
    """``bootstrap_auc`` on positions already sorted by margin (None: no interval to compute)."""
    info: dict[str, Any] = {"method": "percentile bootstrap", "unit": unit, "level": level,
                            "resamples": resamples, "seed": seed, "used": 0, "ci": None,
                            "sequences": None}
    if s is None or s.n_pos == 0 or s.n_neg == 0 or resamples < 1:
        return info
    m_sorted, f_sorted, starts = s.margin, s.flip, s.starts
    n = m_sorted.size
    rng = np.random.default_rng(seed)
    numerator: Callable[[np.ndarray], np.ndarray] | None = None  # sequence counts (resamples x sequences) -> the AUC numerators
    if unit == "sequence":
        seq = np.zeros(n, dtype=np.int64) if sequence is None else np.asarray(sequence, dtype=np.int64)[s.order]
        seq_dense, n_seq = _dense_ids(seq)
        info["sequences"] = n_seq
        width = n_seq
        if _SUFFICIENT_STATISTICS:
            pos_per_seq = np.bincount(seq_dense, weights=f_sorted, minlength=n_seq)
            neg_per_seq = np.bincount(seq_dense, weights=~f_sorted, minlength=n_seq)
            if n_seq * n_seq <= min(_PAIR_MATRIX_MAX, _PAIR_MATRIX_RATIO * n):
                # w^T C w = w^T T w with T upper triangular: T_aa = C_aa, T_ab = C_ab + C_ba (a < b),
                # one triangular product per batch (half a full product's work); every entry exact
                folded = _folded(_pair_matrix(s, seq_dense, n_seq))
                lower = folded.T  # Fortran-ordered: BLAS reads its lower triangle, the upper one of 2T

                def dense(counts: np.ndarray) -> np.ndarray:
                    from scipy.linalg.blas import dtrmm

                    product = dtrmm(1.0, lower, counts.T, side=0, lower=1).T  # (2T^T W^T)^T = 2 W T
                    return np.asarray(np.einsum("ij,ij->i", product, counts) * 0.5, dtype=np.float64)
                numerator = dense
            else:
                stats = _sufficient_statistics(m_sorted, f_sorted, seq_dense, n_seq)
                width = max(n_seq, stats[0].shape[0])

                def sparse(counts: np.ndarray) -> np.ndarray:
                    return _sufficient_numerator(stats, counts)
                numerator = sparse
    else:
        pos_idx = np.flatnonzero(f_sorted)
        neg_idx = np.flatnonzero(~f_sorted)
    chunk = max(1, min(resamples, _CHUNK_ELEMENTS // max(n, 1)))  # the draws' chunking fixes the numbers
    aucs: list[np.ndarray] = []
    pending: list[np.ndarray] = []  # sequence counts drawn, not yet evaluated (evaluated in larger batches)
    waiting = 0  # resamples in pending
    # resamples evaluated together: the (resamples x sequences or buckets) products stay within a quarter chunk
    batch = max(1, _CHUNK_ELEMENTS // 4 // width) if numerator is not None else 1
    done = 0
    while done < resamples:
        b = min(chunk, resamples - done)
        if unit == "sequence":
            counts = _row_bincount(rng.integers(0, n_seq, size=(b, n_seq)), n_seq).astype(np.float64)
            if numerator is not None:
                pending.append(counts)
                waiting += b
                if waiting >= batch or done + b >= resamples:
                    counts = np.concatenate(pending)
                    pending, waiting = [], 0
                    aucs.append(_ratio(numerator(counts), counts @ pos_per_seq, counts @ neg_per_seq))
            else:
                w = counts[:, seq_dense]
                aucs.append(_weighted_auc(w * f_sorted, w * ~f_sorted, starts))
        else:
            w = np.zeros((b, n), dtype=np.float64)
            for idx in (pos_idx, neg_idx):
                w += _row_bincount(idx[rng.integers(0, idx.size, size=(b, idx.size))], n)
            aucs.append(_weighted_auc(w * f_sorted, w * ~f_sorted, starts))
        done += b
    values = np.concatenate(aucs)
    values = values[np.isfinite(values)]
    info["used"] = int(values.size)
    if values.size:
        alpha = (1.0 - level) / 2.0
        lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
        info["ci"] = [float(lo), float(hi)]
    return info


def _row_bincount(draws: np.ndarray, size: int) -> np.ndarray:
    """Per-row counts of the integers in ``draws`` (rows x k, values < size) -> rows x size."""
    rows = draws.shape[0]
    flat = (draws + (np.arange(rows, dtype=np.int64) * size)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * size).reshape(rows, size)


# -- the logistic model ---------------------------------------------------------------------------

def _feature(margin: np.ndarray, eps: float) -> np.ndarray:
    return np.log10(np.asarray(margin, dtype=np.float64) + eps)


def fit_logistic(margin: np.ndarray, flip: np.ndarray, eps: float = EPS) -> dict[str, Any] | None:
    """Logistic regression of flip on log10(margin + eps); None when it cannot be fitted.

    Returns the feature definition and ``intercept``/``slope`` on the unstandardized feature, so that
    P(flip | m) = 1 / (1 + exp(-(intercept + slope * log10(m + eps)))).
    """
    from sklearn.linear_model import LogisticRegression

    flip = np.asarray(flip, dtype=bool)
    if flip.size == 0 or flip.all() or not flip.any():
        return None
    x = _feature(margin, eps)
    mu, sd = float(x.mean()), float(x.std())
    if sd == 0.0:
        return None
    clf = LogisticRegression(C=1.0, max_iter=1000)
    clf.fit(((x - mu) / sd)[:, None], flip)
    w = float(clf.coef_[0, 0]) / sd
    b = float(clf.intercept_[0]) - w * mu
    return {"feature": "log10(ref_margin + eps)", "eps": eps, "intercept": b, "slope": w,
            "regularization": "L2, C=1 on the standardized feature", "solver": "lbfgs"}


def predict(model: dict[str, Any], margin: np.ndarray) -> np.ndarray:
    """P(flip | margin) under a model from ``fit_logistic``."""
    z = model["intercept"] + model["slope"] * _feature(margin, model["eps"])
    return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)


# -- calibration and concentration -----------------------------------------------------------------

def rate_interval(k: int, n: int, level: float = 0.95) -> dict[str, Any]:
    """The exact (Clopper-Pearson) interval of a flip rate, k flips in n positions, from scipy.

    ``interval`` is two-sided (``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``);
    ``upper_one_sided`` is the exact one-sided upper bound (``alternative="less"``), given when k = 0:
    "0 flips in n positions: the rate is below it" (1 - (1 - level)^(1/n), about 3/n at 95%). None
    without positions. Positions are treated as independent trials.
    """
    from scipy.stats import binomtest

    info: dict[str, Any] = {"method": "exact (Clopper-Pearson)",
                            "source": "scipy.stats.binomtest(k, n).proportion_ci(method='exact')",
                            "level": level, "unit": "position", "flips": k, "positions": n,
                            "interval": None, "upper_one_sided": None,
                            "assumes": "independent positions (flips clustered in sequences make it too narrow)"}
    if n <= 0:
        return info
    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    info["interval"] = [float(ci.low), float(ci.high)]
    if k == 0:
        info["upper_one_sided"] = float(binomtest(0, n, alternative="less").proportion_ci(
            confidence_level=level, method="exact").high)
    return info


@functools.cache
def _wilson_source() -> str:
    """Which library's Wilson interval (looked up once per process)."""
    import importlib.util

    if importlib.util.find_spec("statsmodels") is not None:
        return "statsmodels.stats.proportion.proportion_confint(method='wilson')"
    return "scipy.stats.binomtest(k, n).proportion_ci(method='wilson')"


@functools.cache
def _wilson() -> Callable[[int, int, float], tuple[float, float]]:
    """The Wilson interval of ``_wilson_source`` as one function (imported once per process)."""
    if _wilson_source().startswith("statsmodels"):
        import importlib

        confint = importlib.import_module("statsmodels.stats.proportion").proportion_confint

        def statsmodels_wilson(k: int, n: int, level: float) -> tuple[float, float]:
            lo, hi = confint(k, n, alpha=1.0 - level, method="wilson")
            return float(lo), float(hi)
        return statsmodels_wilson
    from scipy.stats import binomtest

    def scipy_wilson(k: int, n: int, level: float) -> tuple[float, float]:
        ci = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
        return float(ci.low), float(ci.high)
    return scipy_wilson


def wilson_interval(k: int, n: int, level: float = 0.95) -> list[float]:
    """Wilson score interval of k in n: statsmodels' ``proportion_confint`` if installed, else scipy's."""
    lo, hi = _wilson()(k, n, level)
    return [max(0.0, lo), min(1.0, hi)]


def positions_needed(rate: float, level: float = 0.95) -> int:
    """Positions needed to see at least one flip with probability ``level`` when each flips with
    probability ``rate``: the smallest n with 1 - (1 - rate)^n >= level, n = ceil(log(1 - level) /
    log(1 - rate))."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate {rate}: must be in (0, 1]")
    if rate == 1.0:
        return 1
    return math.ceil(math.log(1.0 - level) / math.log1p(-rate))


def power(positions: int, rate_ci: dict[str, Any], level: float = 0.95,
          rates: tuple[float, ...] = POWER_RATES) -> dict[str, Any]:
    """How many positions it takes to see a flip at a given rate, next to how many the pair has.

    Rows for the observed rate (when there are flips), the upper end of its exact interval (the
    one-sided bound with no flips) and each of ``rates``; ``note`` says it in words.
    """
    k, n = rate_ci["flips"], rate_ci["positions"]
    basis: list[tuple[float, str]] = []
    if n and k:
        basis.append((k / n, "observed"))
        basis.append((rate_ci["interval"][1], "upper end of the exact interval"))
    elif n:
        basis.append((rate_ci["upper_one_sided"], "one-sided exact upper bound"))
    basis += [(r, "reference") for r in rates]
    rows = [{"rate": r, "basis": why, "positions_needed": positions_needed(r, level), "positions": positions,
             "enough": positions >= positions_needed(r, level)} for r, why in basis if 0.0 < r <= 1.0]
    parts = [f"{r['rate']:.3g} ({r['basis']}) needs {r['positions_needed']:,}" for r in rows]
    return {"level": level, "rule": f"n = ceil(log(1 - {level:g}) / log(1 - p)): the fewest positions with "
                                     f"P(at least one flip) >= {level:g} at flip rate p",
            "rows": rows,
            "note": (f"to see at least one flip with {level:.0%} probability, a flip rate of "
                     + "; ".join(parts) + f" positions (this pair has {positions:,})")}


def _label(lo: float, hi: float) -> str:
    if lo <= 0.0:
        return f"< {hi:.3g}"
    if math.isinf(hi):
        return f">= {lo:.3g}"
    return f"[{lo:.3g}, {hi:.3g})"


def calibration(margin: np.ndarray, flip: np.ndarray, model: dict[str, Any] | None = None,
                bins: str = "decades", n_bins: int = 10, level: float = 0.95) -> list[dict[str, Any]]:
    """Observed vs predicted flip rate per margin bin (non-empty bins only), bins as [lo, hi).

    ``observed_ci``: the Wilson score interval of the bin's flips over its positions
    (``wilson_interval``, a library's, at ``level``).

    ``bins="decades"``: the fixed edges ``DECADE_EDGES`` (comparable across runs and models);
    ``bins="quantile"``: ``n_bins`` bins of about equal positions (fewer where margins tie; the last
    bin is closed).
    """
    margin = np.asarray(margin, dtype=np.float64)
    flip = np.asarray(flip, dtype=bool)
    if margin.size == 0:
        return []
    if bins == "decades":
        edges = np.array(DECADE_EDGES)
        which = np.searchsorted(edges, margin, side="right") - 1
    elif bins == "quantile":
        edges = np.unique(np.quantile(margin, np.linspace(0.0, 1.0, n_bins + 1)))
        if edges.size == 1:
            edges = np.array([edges[0], edges[0]])
        which = np.clip(np.searchsorted(edges, margin, side="right") - 1, 0, edges.size - 2)
    else:
        raise ValueError(f"bins {bins!r}: allowed: decades, quantile")
    pred = predict(model, margin) if model else None
    n_in = np.bincount(which, minlength=edges.size - 1)
    k_in = np.bincount(which[flip], minlength=edges.size - 1)
    bounds = np.r_[0, np.cumsum(n_in)]
    if pred is not None:
        # the predictions grouped by bin, each bin's in the positions' own order (a stable radix sort of
        # the small bin numbers): each mean is the same sum, to the last bit, as over a mask of the bin
        small = which.astype(np.int16) if edges.size < 2**15 else which
        pred = pred[np.argsort(small, kind="stable")]
    rows = []
    for i in range(edges.size - 1):
        n, k = int(n_in[i]), int(k_in[i])
        if not n:
            continue
        lo, hi = float(edges[i]), float(edges[i + 1])
        label = _label(lo, hi) if bins == "decades" else (
            f"[{lo:.3g}, {hi:.3g}]" if i == edges.size - 2 else f"[{lo:.3g}, {hi:.3g})")
        rows.append({"bin": label, "margin_lo": lo, "margin_hi": None if math.isinf(hi) else hi,
                     "positions": n, "flips": k, "observed_rate": k / n, "observed_ci": wilson_interval(k, n, level),
                     "predicted_rate": None if pred is None else float(pred[bounds[i]:bounds[i + 1]].mean())})
    return rows


def concentration(margin: np.ndarray, flip: np.ndarray, share: float) -> dict[str, Any] | None:
    """The margin at or below which ``share`` of the flips lie, and what lies below it.

    ``margin`` is an observed flip margin: the smallest m with at least ``share`` of the flips at
    margin <= m. ``share_of_positions`` is the fraction of all positions at or below it: the smaller
    it is next to ``share``, the more flips concentrate at small margins (``enrichment`` = flip rate at
    or below / overall flip rate).
    """
    flip = np.asarray(flip, dtype=bool)
    if not flip.any():
        return None
    return _concentration(_Sorted(np.asarray(margin, dtype=np.float64), flip), share)


def _concentration(s: _Sorted, share: float) -> dict[str, Any] | None:
    """``concentration`` from the positions sorted by margin (counts by binary search)."""
    if not s.n_pos:
        return None
    m = float(np.quantile(s.margin[s.flip], share, method="inverted_cdf"))
    n_below, k_below = s.at_or_below(m)
    n = s.margin.size
    n_above = n - n_below
    rate_all = s.n_pos / n
    rate_below = k_below / n_below
    return {"flip_share": share, "margin": m, "flips_at_or_below": k_below,
            "share_of_flips": k_below / s.n_pos, "positions_at_or_below": n_below,
            "share_of_positions": n_below / n, "flip_rate_at_or_below": rate_below,
            "flip_rate_above": ((s.n_pos - k_below) / n_above) if n_above else None,
            "enrichment": rate_below / rate_all}


# -- the whole analysis ----------------------------------------------------------------------------

def _undefined_note(positions: int, flips: int) -> str | None:
    if positions == 0:
        return "no teacher-forced positions: nothing to measure"
    if flips == 0:
        return (f"no flips among {positions} positions: ROC-AUC is undefined (it needs flipped and "
                "unflipped positions); the arms agree at every scored position")
    if flips == positions:
        return f"every one of {positions} positions flipped: ROC-AUC is undefined (no unflipped positions)"
    return None


def _too_few_note(positions: int, flips: int) -> str | None:
    """Why a pair gets no AUC interval although its AUC is defined (None: it gets one)."""
    reasons = []
    if flips < AUC_CI_MIN_FLIPS:
        reasons.append(f"too few flips ({flips}) for an interval: at least {AUC_CI_MIN_FLIPS} are needed")
    if positions - flips < AUC_CI_MIN_NON_FLIPS:
        reasons.append(f"too few unflipped positions ({positions - flips}) for an interval: "
                       f"at least {AUC_CI_MIN_NON_FLIPS} are needed")
    return "; ".join(reasons) or None


def analyze(data: FlipData, *, bins: str = "decades", resamples: int = 1000, seed: int = 0,
            level: float = 0.95, ci_unit: str = "sequence", eps: float = EPS) -> dict[str, Any]:
    """One arm pair: flip rate with its exact interval, power, AUC (with its bootstrap interval when
    both classes have enough events), logistic model, calibration and concentration.

    Raises ValueError when ``data`` holds positions of more than one pair: pairs are never pooled.
    """
    if data.pair.size and bool((data.pair != data.pair[0]).any()):
        raise ValueError(f"analyze takes one (sweep, ref_arm, arm) pair; this data holds {np.unique(data.pair).size} "
                         "(use flip_report, or FlipData.for_pair): pairs are never pooled")
    margin, flip = data.margin, data.flip
    positions, flips = len(data), int(flip.sum())
    notes: list[str] = []
    note = _undefined_note(positions, flips)
    ranked = _Sorted(margin, flip) if flips else None  # the one sort: AUC, its bootstrap, concentration
    if note:
        notes.append(note)
    rate_ci = rate_interval(flips, positions, level)
    if positions and not flips:
        notes.append(f"0 flips in {positions} positions: the rate is below {rate_ci['upper_one_sided']:.3g} "
                     f"({level:.0%} one-sided, exact)")
    ci_note = None if note else _too_few_note(positions, flips)
    boot: dict[str, Any] = {"method": "percentile bootstrap", "unit": ci_unit, "level": level,
                            "resamples": resamples, "seed": seed, "used": 0, "ci": None}
    if ci_note:
        notes.append(ci_note)
    elif note is None:
        if ci_unit not in ("sequence", "position"):
            raise ValueError(f"unit {ci_unit!r}: allowed: sequence, position")
        boot = _bootstrap(ranked, data.sequence, resamples=resamples, level=level, seed=seed, unit=ci_unit)
        if boot["ci"] is None:
            notes.append("no bootstrap resample held both classes: no interval")
        elif boot["used"] < resamples:
            notes.append(f"{resamples - boot['used']} of {resamples} resamples held only one class and were left out")
        flip_seqs = np.unique(data.sequence[flip]).size
        if ci_unit == "sequence" and flip_seqs < AUC_CI_MIN_FLIPS:
            notes.append(f"the {flips} flips lie in only {flip_seqs} reference sequences: the sequence bootstrap "
                         "has few independent units with a flip, so its interval is rough")
    model = fit_logistic(margin, flip, eps) if note is None else None
    if note is None and model is None:
        notes.append("every position has the same margin: no logistic model")
    conc = [c for s in CONCENTRATION_SHARES if ranked and (c := _concentration(ranked, s)) is not None]
    if data.dropped:
        notes.append(f"{data.dropped} rows without a usable margin or flag were left out")
    if data.ref_mismatch:
        notes.append(f"{data.ref_mismatch} positions where the reference arm's own argmax is not the token "
                     "it generated (teacher forcing should reproduce decoding)")
    return {
        "positions": positions,
        "flips": flips,
        "flip_rate": flips / positions if positions else None,
        "flip_rate_ci": rate_ci["interval"],
        "rate_ci": rate_ci,
        "power": power(positions, rate_ci, level) if positions else None,
        "auc": _ranks_auc(ranked) if ranked else None,
        "auc_ci": boot["ci"],
        "auc_note": note,
        "auc_ci_note": ci_note,
        "score": "-ref_margin (smaller margin, higher risk)",
        "ci": {**{k: boot.get(k) for k in ("method", "unit", "level", "resamples", "seed", "used", "sequences")},
               "min_flips": AUC_CI_MIN_FLIPS, "min_non_flips": AUC_CI_MIN_NON_FLIPS},
        "model": model,
        "calibration_bins": bins,
        "calibration_ci": {"method": "Wilson score", "source": _wilson_source(), "level": level, "unit": "position"},
        "calibration": calibration(margin, flip, model, bins=bins, level=level),
        "concentration_margin": next((c["margin"] for c in conc if c["flip_share"] == 0.9), None),
        "concentration": conc,
        "dropped": data.dropped,
        "ref_mismatch": data.ref_mismatch,
        "notes": notes,
    }


def flip_report(cat: Catalog, sweep: str | None = None, ref_arm: str | None = None,
                arm: str | None = None, **options: Any) -> dict[str, Any]:
    """``analyze`` per (sweep, ref_arm, arm) pair of the selected teacher-forced rows; nothing pooled.

    Returns ``{"filters": {...}, "pairs": [{"sweep", "ref_arm", "arm", **analyze(pair)}, ...],
    "notes": [...]}``: no figure at the top level, whether one pair or many are selected. ``options``
    go to ``analyze`` (bins, resamples, seed, level, ci_unit, eps).
    """
    keys = [k for k in cat.named("teacher_forced_pairs", sweep=sweep)
            if (ref_arm is None or k["ref_arm"] == ref_arm) and (arm is None or k["arm"] == arm)]
    # One pair at a time: memory is bounded by the largest pair, never by the whole table. A NULL key
    # cannot be selected alone: then the selection is read whole.
    selections = [{"sweep": k["sweep"], "ref_arm": k["ref_arm"], "arm": k["arm"]} for k in keys]
    whole = not all(None not in sel.values() for sel in selections)
    pairs = []
    for sel in [{"sweep": sweep, "ref_arm": ref_arm, "arm": arm}] if whole else selections:
        data = (_from_arrow(cat.named_arrow("flip_positions", **sel)) if whole else _load_pairs(cat, [sel]))
        pairs += [{**key, **analyze(data.for_pair(pid), **options)} for pid, key in enumerate(data.pairs)]
    notes = [] if pairs else ["no teacher-forced positions for this selection"]
    return {"filters": {"sweep": sweep, "ref_arm": ref_arm, "arm": arm}, "pairs": pairs, "notes": notes}
