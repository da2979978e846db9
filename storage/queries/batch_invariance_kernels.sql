-- Batch invariance per kernel (kind batch_invariance, level kernel): one row per (sweep, experiment,
-- kernel, dtype, out_dtype, scale_mode, k, n, tolerance_spacings, algorithm, accumulate, threads), over
-- every seed, batch size M and probe position. cells: (seed, M, position) cells; cells_bitwise_equal:
-- cells whose probe output row is bit-identical to the probe computed alone (M = 1);
-- cells_beyond_tolerance: cells more than tolerance_spacings output spacings away or with a NaN/Inf
-- mismatch; elements / differing: output elements compared / not bit-identical; max_spacing: the
-- largest distance in output spacings (ordered bit patterns); first_varying_m: the smallest M with a
-- differing cell (NULL when none); varying_ms: every such M.
-- The declared algorithm's bound (issue #26; NULL columns in rows written before it): cells_judged:
-- cells carrying the bound columns; cells_beyond_bound: cells where an element of the probe in the
-- batch or of the probe alone lies outside the algorithm's bound, or a NaN/Inf differs;
-- outside_bound: elements of the batch rows outside (summed over cells); max_reference_outside_bound:
-- the most elements of one alone row outside; max_bound_ratio: the largest |batch - alone| / (bound
-- width) of any element. threads: the torch thread count the cells ran at.
-- reports.noise_floor turns a row into the kernel's verdict.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    experiment,
    kernel,
    any_value(kernel_name)                                               AS kernel_name,
    any_value(device)                                                    AS device,
    dtype,
    out_dtype,
    scale_mode,
    k,
    n,
    tolerance_spacings,
    algorithm,
    accumulate,
    threads,
    count(DISTINCT seed)::BIGINT                                         AS seeds,
    count(DISTINCT m)::BIGINT                                            AS batch_sizes,
    min(m)::BIGINT                                                       AS min_m,
    max(m)::BIGINT                                                       AS max_m,
    list_sort(list_distinct(list(position)))                             AS positions,
    count(*)::BIGINT                                                     AS cells,
    count(*) FILTER (WHERE bitwise_equal)::BIGINT                        AS cells_bitwise_equal,
    count(*) FILTER (WHERE max_spacing > tolerance_spacings
                        OR nonfinite_mismatch > 0)::BIGINT               AS cells_beyond_tolerance,
    sum(elements)::BIGINT                                                AS elements,
    sum(differing)::BIGINT                                               AS differing,
    max(max_spacing)::BIGINT                                             AS max_spacing,
    sum(nonfinite_mismatch)::BIGINT                                      AS nonfinite_mismatch,
    min(m) FILTER (WHERE NOT bitwise_equal)::BIGINT                      AS first_varying_m,
    coalesce(list_sort(list_distinct(list(m) FILTER (WHERE NOT bitwise_equal))), [])
                                                                         AS varying_ms,
    count(*) FILTER (WHERE outside_bound IS NOT NULL)::BIGINT            AS cells_judged,
    count(*) FILTER (WHERE outside_bound > 0 OR reference_outside_bound > 0
                        OR (outside_bound IS NOT NULL AND nonfinite_mismatch > 0))::BIGINT
                                                                         AS cells_beyond_bound,
    sum(outside_bound)::BIGINT                                           AS outside_bound,
    max(reference_outside_bound)::BIGINT                                 AS max_reference_outside_bound,
    max(max_bound_ratio)                                                 AS max_bound_ratio
FROM batch_invariance
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, experiment, kernel, dtype, out_dtype, scale_mode, k, n, tolerance_spacings, algorithm, accumulate,
         threads
ORDER BY sweep, experiment, kernel, dtype, out_dtype, scale_mode, k, n, algorithm, accumulate, threads
