-- Quantizer comparison per (sweep, experiment, reference, candidate), summed over every captured layer call.
-- Columns: reference_params / candidate_params (each side's parameters, JSON; NULL in results
-- written before they were recorded), layers (distinct layer calls), elements / q_differing / q_frac_differing (quantized
-- values that differ), q_max_abs_diff (largest |q_ref - q_cand|: int8 steps, or FP8 values),
-- q_max_spacing (the same in spacings of the q format), tokens / scales_differing /
-- scale_max_spacing (per-token scales, in spacings of scale_format), out_* (both sides through the
-- same GEMM kernel: output elements that differ and the largest distance in output spacings, over
-- all outputs and over outputs >= 5% of the layer's largest (_significant); NULL for FP8 rows written
-- before FP8 pairs had a downstream), gemm_weights (the weights that GEMM multiplied: the engine's
-- int8, or FP8 e4m3 per channel for an FP8 pair; NULL in results written before it was recorded),
-- identical_out_layers (layer calls whose GEMM outputs are bit-identical).
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    experiment,
    model,
    activation_dtype,
    reference,
    candidate,
    any_value(reference_quantizer)                               AS reference_quantizer,
    any_value(candidate_quantizer)                               AS candidate_quantizer,
    any_value(reference_params)                                  AS reference_params,
    any_value(candidate_params)                                  AS candidate_params,
    any_value(gemm_kernel)                                       AS gemm_kernel,
    any_value(gemm_weights)                                      AS gemm_weights,
    any_value(q_dtype)                                           AS q_dtype,
    count(DISTINCT layer)::BIGINT                                AS layers,
    sum(elements)::BIGINT                                        AS elements,
    sum(q_differing)::BIGINT                                     AS q_differing,
    sum(q_differing) / sum(elements)                             AS q_frac_differing,
    max(q_max_abs_diff)                                          AS q_max_abs_diff,
    max(q_max_spacing)::BIGINT                                   AS q_max_spacing,
    sum(tokens)::BIGINT                                          AS tokens,
    sum(scales_differing)::BIGINT                                AS scales_differing,
    string_agg(DISTINCT scale_format, ',')                       AS scale_format,
    max(scale_max_spacing)::BIGINT                               AS scale_max_spacing,
    sum(out_elements)::BIGINT                                    AS out_elements,
    sum(out_differing)::BIGINT                                   AS out_differing,
    sum(out_differing) / sum(out_elements)                       AS out_frac_differing,
    max(out_max_spacing)::BIGINT                                 AS out_max_spacing,
    max(out_max_spacing_significant)::BIGINT                     AS out_max_spacing_significant,
    count(DISTINCT layer) FILTER (WHERE out_bitwise_equal)::BIGINT AS identical_out_layers
FROM quantize
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, experiment, model, activation_dtype, reference, candidate
ORDER BY sweep, experiment, model, activation_dtype, reference, candidate
