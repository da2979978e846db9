"""Two outputs of one format compared element by element: bitwise, and in output spacings.

One definition of the statistics every GEMM comparison reports (``kdepth`` and ``replay`` rows;
the column meanings are in docs/schema.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Outputs at least this fraction of max|reference| count for ``max_spacing_significant``: spacing
#: counts near zero run through every tiny binade and say little (docs/reference/numerics.md §5.1).
SIGNIFICANT = 0.05


def compare(out_a: Any, out_b: Any, fmt: Any) -> dict[str, Any]:
    """Bitwise and spacing statistics of two outputs of one format (``out_b`` the reference side)."""
    from tasks.numerics import distance

    d = np.asarray(distance(out_a, out_b, fmt)).reshape(-1)
    va = out_a.double().numpy().reshape(-1)
    vb = out_b.double().numpy().reshape(-1)
    differs = d != 0
    nonfinite = differs & ~(np.isfinite(va) & np.isfinite(vb))
    comparable = d >= 0
    finite = np.isfinite(va) & np.isfinite(vb)
    abs_err = np.zeros_like(va)
    abs_err[finite] = np.abs(va[finite] - vb[finite])
    big = np.abs(vb) >= SIGNIFICANT * np.max(np.abs(np.where(np.isfinite(vb), vb, 0.0)), initial=0.0)
    worst = int(np.argmax(np.where(comparable, d, -1))) if d.size else 0
    n_cols = out_a.shape[-1] if out_a.dim() > 1 else 1
    return {
        "elements": int(d.size),
        "differing": int(differs.sum()),
        "frac_differing": float(differs.mean()) if d.size else 0.0,
        "max_spacing": int(d[comparable].max(initial=0)),
        "max_spacing_significant": int(d[comparable & big].max(initial=0)),
        "hist_0": int((d == 0).sum()),
        "hist_1": int((d == 1).sum()),
        "hist_2": int((d == 2).sum()),
        "hist_gt2": int((d > 2).sum()),
        "nonfinite_mismatch": int(nonfinite.sum()),
        "max_abs_error": float(abs_err.max(initial=0.0)),
        "worst_row": worst // n_cols,
        "worst_col": worst % n_cols,
        "worst_a": float(va[worst]) if d.size else None,
        "worst_b": float(vb[worst]) if d.size else None,
    }
