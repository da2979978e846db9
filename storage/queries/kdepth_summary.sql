-- K-depth table: one row per (sweep, dtype, impl_a, impl_b, scale_mode, k), summed over seeds.
-- The one definition of K-depth results: `report kdepth` shows it; conformance, the HTML curves
-- and the nightly metrics sum it over K (reports.kdepth.pair_totals).
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
    max(max_abs_error)                      AS max_abs_error
FROM kdepth
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY ALL
ORDER BY sweep, dtype, out_dtype, comparison DESC, impl_a, impl_b, scale_mode, k
