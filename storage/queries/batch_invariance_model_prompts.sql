-- The model's noise floor over every batch shape of a comparison (kind batch_invariance, level model):
-- one row per (sweep, experiment, model, kernel, attention, scales, reductions, comparison; attention:
-- the experiment's attention kernel, NULL when it ran the one its reductions pick). prompts: prompts
-- compared; prompts_argmax_differ: prompts whose argmax differs from the prompt alone at some position
-- in at least one batch size (the figure the certificate quotes as the noise floor);
-- prompts_logits_differ: the same for any logit not bit-identical; batch_sizes: the sizes compared;
-- positions_per_batch: positions compared in each.
-- Parameters: $sweep (NULL for every sweep).
WITH per_prompt AS (
    SELECT
        sweep, experiment, model, kernel, coalesce(attention, '') AS attention_key, scales, reductions, comparison,
        prompt_index,
        bool_or(NOT argmax_equal)  AS argmax_differs,
        bool_or(NOT logits_equal)  AS logits_differ
    FROM batch_invariance_model
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY ALL
),
shapes AS (
    SELECT
        sweep, experiment, model, kernel, coalesce(attention, '') AS attention_key, scales, reductions, comparison,
        list_sort(list_distinct(list(batch)))  AS batch_sizes,
        count(*) // count(DISTINCT batch)      AS positions_per_batch
    FROM batch_invariance_model
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY ALL
)
SELECT
    p.sweep, p.experiment, p.model, p.kernel, nullif(p.attention_key, '') AS attention, p.scales, p.reductions,
    p.comparison,
    count(*)::BIGINT                                     AS prompts,
    count(*) FILTER (WHERE p.argmax_differs)::BIGINT     AS prompts_argmax_differ,
    count(*) FILTER (WHERE p.logits_differ)::BIGINT      AS prompts_logits_differ,
    any_value(s.batch_sizes)                             AS batch_sizes,
    any_value(s.positions_per_batch)::BIGINT             AS positions_per_batch
FROM per_prompt p
JOIN shapes s USING (sweep, experiment, model, kernel, attention_key, scales, reductions, comparison)
GROUP BY p.sweep, p.experiment, p.model, p.kernel, p.attention_key, p.scales, p.reductions, p.comparison
ORDER BY p.sweep, p.experiment, p.model, p.kernel, p.attention_key, p.scales, p.reductions, p.comparison
