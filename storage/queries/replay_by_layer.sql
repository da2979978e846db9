-- Per-layer replay table: one row per (sweep, layer, scale_mode, pair), summed over units.
-- comparison = 'capture' rows check the captured output against the capture kernel's replay.
-- Spacing columns as in replay_by_type (raw max_spacing, normal-range max_spacing_significant, hist_*,
-- max_abs_error, near_zero_*).
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    model,
    layer,
    any_value(layer_index)                   AS layer_index,
    any_value(layer_type)                    AS layer_type,
    scale_mode,
    comparison,
    impl_a,
    impl_b,
    count(*)::BIGINT                         AS units,
    sum(elements)::BIGINT                    AS elements,
    sum(differing)::BIGINT                   AS differing,
    sum(differing) / sum(elements)           AS frac_differing,
    max(max_spacing)::BIGINT                 AS max_spacing,
    bool_and(bitwise_equal)                  AS bitwise_equal,
    bool_and(accumulators_equal)             AS accumulators_equal,
    bool_and(accumulators_exact)             AS accumulators_exact,
    max(max_spacing_significant)::BIGINT     AS max_spacing_significant,
    sum(hist_1)::BIGINT                                        AS hist_1,
    sum(hist_2)::BIGINT                                        AS hist_2,
    sum(hist_gt2)::BIGINT                                      AS hist_gt2,
    max(max_abs_error)                                         AS max_abs_error,
-- include: _near_zero_totals
FROM replay
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, model, layer, scale_mode, comparison, impl_a, impl_b
ORDER BY sweep, comparison, impl_a, impl_b, scale_mode, layer_index, layer
