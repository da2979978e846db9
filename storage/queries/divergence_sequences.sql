-- Teacher-forced distribution figures per reference sequence (report divergence): per sweep,
-- (ref_arm, arm) pair and reference sequence (ref_restart, prompt_index):
--   positions    every generated position (row);
--   measured     positions with both probabilities of the reference token and its k3 term recorded
--                (NULL in results written before the columns existed, and on vLLM where the reference
--                generate unit recorded no teacher_forced_token_logprob);
--   measured_kl  those of them whose exact KL(ref || arm) is recorded too (never on the vLLM engine:
--                the two full distributions are never in one process there; docs/divergence.md).
-- The sums and maxima of |p_ref - p_arm| and of the k3 term are over the `measured` positions, those of
-- the KL over the `measured_kl` positions: each figure's own positions, never one set's sum divided by
-- another set's count.
-- Parameters: $sweep (NULL for every sweep).
WITH t AS (
    SELECT sweep, ref_arm, arm, ref_restart, prompt_index, ref_token_prob_ref, ref_token_prob_arm, k3_ref_arm,
           kl_ref_arm,
           ref_token_prob_ref IS NOT NULL AND ref_token_prob_arm IS NOT NULL AND k3_ref_arm IS NOT NULL AS m
    FROM teacher_forced
    WHERE $sweep IS NULL OR sweep = $sweep
)
SELECT
    sweep, ref_arm, arm, ref_restart, prompt_index,
    count(*)::BIGINT                                                                  AS positions,
    count(*) FILTER (WHERE m)::BIGINT                                                 AS measured,
    count(*) FILTER (WHERE m AND kl_ref_arm IS NOT NULL)::BIGINT                      AS measured_kl,
    sum(abs(ref_token_prob_ref - ref_token_prob_arm)) FILTER (WHERE m)                AS sum_abs_prob_diff,
    max(abs(ref_token_prob_ref - ref_token_prob_arm)) FILTER (WHERE m)                AS max_abs_prob_diff,
    sum(k3_ref_arm) FILTER (WHERE m)                                                  AS sum_k3,
    sum(kl_ref_arm) FILTER (WHERE m AND kl_ref_arm IS NOT NULL)                       AS sum_kl,
    max(kl_ref_arm) FILTER (WHERE m AND kl_ref_arm IS NOT NULL)                       AS max_kl
FROM t
GROUP BY sweep, ref_arm, arm, ref_restart, prompt_index
ORDER BY sweep, ref_arm, arm, ref_restart, prompt_index
