-- Attention replay per (sweep, comparison, impl_a, impl_b, dtype), summed over layers: how many
-- attention layers are bit-identical, output elements and differing elements, the largest distance
-- in spacings of the dtype (and among outputs of at least 5% of max|reference|, where spacing counts
-- do not run through tiny binades), and the logsumexp differences (fp32 spacings). comparison 'pair' compares
-- two kernels; 'reference' compares one kernel with the float64 attention rounded once (impl_b
-- 'fp64-reference'). On reference rows of a kernel with an algorithm: the algorithm, and the output and
-- logsumexp elements outside its bounds (NULL without one). hist_*: outputs 1, 2 and more than 2
-- spacings apart; near_zero_*: the near-zero outputs farther apart than max_spacing_significant, the
-- normal-range max (_near_zero_totals, docs/schema.md "Spacing distances").
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    comparison,
    impl_a,
    impl_b,
    dtype,
    count(DISTINCT layer)::BIGINT                              AS layers,
    count(DISTINCT layer) FILTER (WHERE bitwise_equal)::BIGINT AS identical_layers,
    sum(elements)::BIGINT                                      AS elements,
    sum(differing)::BIGINT                                     AS differing,
    max(max_spacing)::BIGINT                                   AS max_spacing,
    max(max_spacing_significant)::BIGINT                       AS max_spacing_significant,
    max(max_abs_error)                                         AS max_abs_error,
    sum(lse_elements)::BIGINT                                  AS lse_elements,
    sum(lse_differing)::BIGINT                                 AS lse_differing,
    max(lse_max_spacing)::BIGINT                               AS lse_max_spacing,
    max(lse_max_abs_error)                                     AS lse_max_abs_error,
    string_agg(DISTINCT algorithm, ',' ORDER BY algorithm)     AS algorithm,
    sum(outside_bound)::BIGINT                                 AS outside_bound,
    sum(lse_outside_bound)::BIGINT                             AS lse_outside_bound,
    sum(hist_1)::BIGINT                                        AS hist_1,
    sum(hist_2)::BIGINT                                        AS hist_2,
    sum(hist_gt2)::BIGINT                                      AS hist_gt2,
-- include: _near_zero_totals
FROM attention_replay
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, comparison, impl_a, impl_b, dtype
ORDER BY sweep, comparison DESC, impl_a, impl_b, dtype
