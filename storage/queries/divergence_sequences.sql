-- Teacher-forced distribution figures per reference sequence (report divergence): per sweep,
-- (ref_arm, arm) pair and reference sequence (ref_restart, prompt_index), over its generated
-- positions whose probability columns were recorded (measured; NULL on the vLLM engine and in
-- results written before the columns existed): the sums and maxima of |p_ref - p_arm| of the
-- reference token, of the k3 term and of the exact KL(ref || arm). positions counts every row,
-- measured those with all four columns.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep, ref_arm, arm, ref_restart, prompt_index,
    count(*)::BIGINT                                                                  AS positions,
    count(*) FILTER (WHERE ref_token_prob_ref IS NOT NULL AND ref_token_prob_arm IS NOT NULL
                      AND kl_ref_arm IS NOT NULL AND k3_ref_arm IS NOT NULL)::BIGINT AS measured,
    sum(abs(ref_token_prob_ref - ref_token_prob_arm))                                 AS sum_abs_prob_diff,
    max(abs(ref_token_prob_ref - ref_token_prob_arm))                                 AS max_abs_prob_diff,
    sum(k3_ref_arm)                                                                   AS sum_k3,
    sum(kl_ref_arm)                                                                   AS sum_kl,
    max(kl_ref_arm)                                                                   AS max_kl
FROM teacher_forced
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, ref_arm, arm, ref_restart, prompt_index
ORDER BY sweep, ref_arm, arm, ref_restart, prompt_index
