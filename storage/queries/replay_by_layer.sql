-- Per-layer replay table: one row per (sweep, layer, scale_mode, pair), summed over units.
-- comparison = 'capture' rows check the captured output against the capture kernel's replay.
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
    bool_and(accumulators_exact)             AS accumulators_exact
FROM replay
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, model, layer, scale_mode, comparison, impl_a, impl_b
ORDER BY sweep, comparison, impl_a, impl_b, scale_mode, layer_index, layer
