-- Batch invariance per kernel and batch size M (kind batch_invariance, level kernel): one row per
-- (sweep, experiment, kernel, scale_mode, out_dtype, threads, M), over seeds and probe positions. cells:
-- (seed, position) cells; cells_bitwise_equal: cells whose probe output row is bit-identical to the
-- probe alone (M = 1); differing: output elements not bit-identical (of elements); max_spacing: the
-- largest distance in output spacings; nonfinite_mismatch: NaN/Inf mismatches; cells_beyond_bound:
-- cells with an element outside the declared algorithm's bound (NULL-safe: rows written before the
-- bound count as not judged); max_bound_ratio: the largest |batch - alone| / (bound width).
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    experiment,
    kernel,
    scale_mode,
    out_dtype,
    threads,
    m,
    count(*)::BIGINT                                 AS cells,
    count(*) FILTER (WHERE bitwise_equal)::BIGINT    AS cells_bitwise_equal,
    sum(elements)::BIGINT                            AS elements,
    sum(differing)::BIGINT                           AS differing,
    max(max_spacing)::BIGINT                         AS max_spacing,
    sum(nonfinite_mismatch)::BIGINT                  AS nonfinite_mismatch,
    count(*) FILTER (WHERE outside_bound > 0 OR reference_outside_bound > 0)::BIGINT
                                                     AS cells_beyond_bound,
    max(max_bound_ratio)                             AS max_bound_ratio
FROM batch_invariance
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, experiment, kernel, scale_mode, out_dtype, threads, m
ORDER BY sweep, experiment, kernel, scale_mode, out_dtype, threads, m
