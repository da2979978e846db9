-- Batch invariance per attention kernel (kind batch_invariance, level kernel, attention_kernels): one
-- row per (sweep, experiment, kernel, dtype, heads, seq_len, head_dim, tolerance_spacings), over every
-- seed, batch size B and probe position. cells: (seed, B, position) cells; cells_bitwise_equal: cells
-- whose probe element's output and logsumexp are bit-identical to the probe computed alone (B = 1);
-- cells_beyond_tolerance: cells whose output or logsumexp is more than tolerance_spacings spacings
-- away, or with a NaN/Inf mismatch; elements / differing: output elements compared / not
-- bit-identical; max_spacing: the largest output distance in spacings of the dtype; lse_differing /
-- lse_max_spacing: the same for the logsumexp (fp32 spacings); min_batch / max_batch / batch_sizes:
-- the B axis; first_varying_batch: the smallest B with a differing cell (NULL when none).
-- reports.noise_floor turns a row into the kernel's verdict, as for GEMM kernels.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    experiment,
    kernel,
    any_value(device)                                                    AS device,
    dtype,
    heads,
    seq_len,
    head_dim,
    tolerance_spacings,
    count(DISTINCT seed)::BIGINT                                         AS seeds,
    count(DISTINCT batch)::BIGINT                                        AS batch_sizes,
    min(batch)::BIGINT                                                   AS min_batch,
    max(batch)::BIGINT                                                   AS max_batch,
    list_sort(list_distinct(list(position)))                             AS positions,
    count(*)::BIGINT                                                     AS cells,
    count(*) FILTER (WHERE bitwise_equal)::BIGINT                        AS cells_bitwise_equal,
    count(*) FILTER (WHERE max_spacing > tolerance_spacings
                        OR lse_max_spacing > tolerance_spacings
                        OR nonfinite_mismatch > 0)::BIGINT               AS cells_beyond_tolerance,
    sum(elements)::BIGINT                                                AS elements,
    sum(differing)::BIGINT                                               AS differing,
    max(max_spacing)::BIGINT                                             AS max_spacing,
    sum(lse_differing)::BIGINT                                           AS lse_differing,
    max(lse_max_spacing)::BIGINT                                         AS lse_max_spacing,
    sum(nonfinite_mismatch)::BIGINT                                      AS nonfinite_mismatch,
    min(batch) FILTER (WHERE NOT bitwise_equal)::BIGINT                  AS first_varying_batch
FROM batch_invariance_attention
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, experiment, kernel, dtype, heads, seq_len, head_dim, tolerance_spacings
ORDER BY sweep, experiment, kernel, dtype, heads, seq_len, head_dim
