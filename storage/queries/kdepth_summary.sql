-- K-depth table: one row per (sweep, dtype, impl_a, impl_b, scale_mode, k), summed over seeds.
-- The one definition of K-depth results: `report kdepth` shows it; conformance, the HTML curves
-- and the nightly metrics sum it over K (reports.kdepth.pair_totals).
--
-- Spacing distances, each named for what it is (docs/schema.md, "Spacing distances"):
--   max_spacing              the raw largest distance over every output (near-zero ones included);
--   max_spacing_significant  the normal-range max: the largest distance over outputs with
--                            |reference| >= 5% of the unit's largest |reference| (tasks/comparison.py);
--                            THE max spacing every report shows and the nightly tracks;
--   near_zero_beyond         outputs more than max_spacing_significant spacings apart: all near zero
--                            (|reference| < 5% of the largest), from the histogram; exact unless
--                            near_zero_beyond_exact is false (then a lower bound);
--   near_zero_max_spacing    their largest distance (NULL: none);
--   near_zero_worst_abs_error |a - b| at the farthest of them (NULL: none); max_abs_error, the largest
--                            |a - b| over all outputs, is its yardstick (_near_zero_totals).
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    dtype,
    out_dtype,
    comparison,
    impl_a,
    impl_b,
    scale_mode,
    k,
    count(DISTINCT seed)::BIGINT            AS seeds,
    sum(elements)::BIGINT                   AS elements,
    sum(differing)::BIGINT                  AS differing,
    sum(differing) / sum(elements)          AS frac_differing,
    max(max_spacing)::BIGINT                AS max_spacing,
    max(max_spacing_significant)::BIGINT    AS max_spacing_significant,
    sum(hist_0)::BIGINT                     AS hist_0,
    sum(hist_1)::BIGINT                     AS hist_1,
    sum(hist_2)::BIGINT                     AS hist_2,
    sum(hist_gt2)::BIGINT                   AS hist_gt2,
    sum(nonfinite_mismatch)::BIGINT         AS nonfinite_mismatch,
    max(max_abs_error)                      AS max_abs_error,
-- include: _near_zero_totals
FROM kdepth
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY ALL
ORDER BY sweep, dtype, out_dtype, comparison DESC, impl_a, impl_b, scale_mode, k
