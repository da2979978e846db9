-- The model's noise floor per batch shape (kind batch_invariance, level model): one row per (sweep,
-- experiment, model, kernel, attention, scales, reductions, comparison, batch; attention: the
-- experiment's attention kernel, NULL when it ran the one its reductions pick). Each compares every prompt's
-- logits in a batch of `batch` sequences (comparison padded_prefill: one left-padded forward pass;
-- decode: greedy KV-cache decoding) with the same prompt scored alone (prefill, batch of one).
-- prompts: prompts compared; prompts_argmax_differ: prompts with at least one position whose argmax
-- differs (the sequences the same kernel changes by batch shape alone); positions / positions_argmax_differ
-- / positions_logits_differ: positions compared / whose argmax differs / with any logit not
-- bit-identical; max_spacing: the largest logit distance over the vocabulary in fp32 spacings;
-- max_spacing_significant: the same over logits of at least 5% of the position's largest |logit|;
-- max_argmax_spacing: the largest distance of the reference argmax's logit; max_flip_margin: the
-- largest reference top-1/top-2 margin at a position whose argmax differs (NULL: none);
-- positions_near_zero_max: positions whose largest distance lies at a logit below 5% of the largest
-- (max_spacing > max_spacing_significant): there a logit near zero -- one that changed sign counts
-- every fp32 value between, up to about 2^31 spacings -- makes max_spacing, so the reports show
-- max_spacing_significant (the normal range) first and max_spacing labelled raw.
-- Parameters: $sweep (NULL for every sweep).
WITH per_prompt AS (
    SELECT
        sweep, experiment, model, kernel, attention, scales, reductions, comparison, batch, prompt_index,
        count(*)                                         AS positions,
        count(*) FILTER (WHERE NOT argmax_equal)         AS positions_argmax_differ,
        count(*) FILTER (WHERE NOT logits_equal)         AS positions_logits_differ,
        max(max_spacing)                                 AS max_spacing,
        max(max_spacing_significant)                     AS max_spacing_significant,
        count(*) FILTER (WHERE max_spacing > max_spacing_significant) AS positions_near_zero_max,
        max(argmax_spacing)                              AS max_argmax_spacing,
        max(ref_margin) FILTER (WHERE NOT argmax_equal)  AS max_flip_margin,
        sum(nonfinite_mismatch)                          AS nonfinite_mismatch
    FROM batch_invariance_model
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY ALL
)
SELECT
    sweep, experiment, model, kernel, attention, scales, reductions, comparison, batch,
    count(*)::BIGINT                                            AS prompts,
    count(*) FILTER (WHERE positions_argmax_differ > 0)::BIGINT AS prompts_argmax_differ,
    count(*) FILTER (WHERE positions_logits_differ > 0)::BIGINT AS prompts_logits_differ,
    sum(positions)::BIGINT                                      AS positions,
    sum(positions_argmax_differ)::BIGINT                        AS positions_argmax_differ,
    sum(positions_logits_differ)::BIGINT                        AS positions_logits_differ,
    max(max_spacing)::BIGINT                                    AS max_spacing,
    max(max_spacing_significant)::BIGINT                        AS max_spacing_significant,
    sum(positions_near_zero_max)::BIGINT                        AS positions_near_zero_max,
    max(max_argmax_spacing)::BIGINT                             AS max_argmax_spacing,
    max(max_flip_margin)                                        AS max_flip_margin,
    sum(nonfinite_mismatch)::BIGINT                             AS nonfinite_mismatch
FROM per_prompt
GROUP BY ALL
ORDER BY sweep, experiment, model, kernel, attention NULLS FIRST, scales, reductions, comparison, batch
