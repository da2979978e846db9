-- Batch invariance per kernel and batch size M (kind batch_invariance, level kernel): one row per
-- (sweep, experiment, kernel, scale_mode, out_dtype, M), over seeds and probe positions. cells: (seed,
-- position) cells; cells_bitwise_equal: cells whose probe output row is bit-identical to the probe
-- alone (M = 1); differing: output elements not bit-identical (of elements); max_spacing: the largest
-- distance in output spacings; nonfinite_mismatch: NaN/Inf mismatches.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    experiment,
    kernel,
    scale_mode,
    out_dtype,
    m,
    count(*)::BIGINT                                 AS cells,
    count(*) FILTER (WHERE bitwise_equal)::BIGINT    AS cells_bitwise_equal,
    sum(elements)::BIGINT                            AS elements,
    sum(differing)::BIGINT                           AS differing,
    max(max_spacing)::BIGINT                         AS max_spacing,
    sum(nonfinite_mismatch)::BIGINT                  AS nonfinite_mismatch
FROM batch_invariance
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, experiment, kernel, scale_mode, out_dtype, m
ORDER BY sweep, experiment, kernel, scale_mode, out_dtype, m
