-- Quantizer comparison per (sweep, experiment, layer call, reference, candidate): one row per layer call.
-- Columns as in quantize_by_pair, per layer: q_frac_differing, q_max_abs_diff, scales_differing of
-- tokens, scale_max_spacing, out_differing of out_elements, out_max_spacing, out_bitwise_equal.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    experiment,
    model,
    activation_dtype,
    reference,
    candidate,
    layer,
    layer_index,
    layer_type,
    any_value(q_dtype)                          AS q_dtype,
    sum(elements)::BIGINT                       AS elements,
    sum(q_differing)::BIGINT                    AS q_differing,
    sum(q_differing) / sum(elements)            AS q_frac_differing,
    max(q_max_abs_diff)                         AS q_max_abs_diff,
    sum(tokens)::BIGINT                         AS tokens,
    sum(scales_differing)::BIGINT               AS scales_differing,
    max(scale_max_spacing)::BIGINT              AS scale_max_spacing,
    sum(out_elements)::BIGINT                   AS out_elements,
    sum(out_differing)::BIGINT                  AS out_differing,
    max(out_max_spacing)::BIGINT                AS out_max_spacing,
    bool_and(out_bitwise_equal)                 AS out_bitwise_equal
FROM quantize
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, experiment, model, activation_dtype, reference, candidate, layer, layer_index, layer_type
ORDER BY sweep, experiment, model, activation_dtype, reference, candidate, layer_index, list_position(['q', 'k', 'v', 'o', 'gate', 'up', 'down'], layer_type), layer
