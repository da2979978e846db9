-- K-depth per seed: one row per (sweep, dtype, pair, scale_mode, k, seed), for the spread across
-- seeds that the HTML curves draw (reports.figures). The totals over seeds are kdepth_summary's.
-- Columns: the group keys, elements and differing (sums over the units of that seed),
-- frac_differing = differing / elements.
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
    seed,
    sum(elements)::BIGINT                   AS elements,
    sum(differing)::BIGINT                  AS differing,
    sum(differing) / sum(elements)          AS frac_differing
FROM kdepth
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY ALL
ORDER BY sweep, dtype, out_dtype, comparison DESC, impl_a, impl_b, scale_mode, k, seed
