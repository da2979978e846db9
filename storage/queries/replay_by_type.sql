-- Replay summary per layer type (q, k, v, o, gate, up, down): how many layers are bit-identical.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    comparison,
    impl_a,
    impl_b,
    scale_mode,
    layer_type,
    count(DISTINCT layer)::BIGINT                              AS layers,
    count(DISTINCT layer) FILTER (WHERE bitwise_equal)::BIGINT AS identical_layers,
    sum(elements)::BIGINT                                      AS elements,
    sum(differing)::BIGINT                                     AS differing,
    sum(differing) / sum(elements)                             AS frac_differing,
    max(max_spacing)::BIGINT                                   AS max_spacing,
    bool_and(accumulators_equal)                               AS accumulators_equal
FROM replay
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, comparison, impl_a, impl_b, scale_mode, layer_type
ORDER BY sweep, comparison DESC, impl_a, impl_b, scale_mode,
    list_position(['q', 'k', 'v', 'o', 'gate', 'up', 'down'], layer_type), layer_type
