-- Replay summary per layer type (q, k, v, o, gate, up, down): how many layers are bit-identical.
-- max_spacing is the raw largest distance (near-zero outputs included), max_spacing_significant the
-- normal-range max (outputs >= 5% of the unit's largest |reference|), hist_* outputs 1, 2 and more
-- than 2 spacings apart, max_abs_error the largest |a - b|, near_zero_* the near-zero outputs beyond
-- the normal-range max (_near_zero_totals, docs/schema.md "Spacing distances").
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
    bool_and(accumulators_equal)                               AS accumulators_equal,
    max(max_spacing_significant)::BIGINT                       AS max_spacing_significant,
    sum(hist_1)::BIGINT                                        AS hist_1,
    sum(hist_2)::BIGINT                                        AS hist_2,
    sum(hist_gt2)::BIGINT                                      AS hist_gt2,
    max(max_abs_error)                                         AS max_abs_error,
-- include: _near_zero_totals
FROM replay
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, comparison, impl_a, impl_b, scale_mode, layer_type
ORDER BY sweep, comparison DESC, impl_a, impl_b, scale_mode,
    list_position(['q', 'k', 'v', 'o', 'gate', 'up', 'down'], layer_type), layer_type
