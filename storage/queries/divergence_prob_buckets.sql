-- Flips by the reference token's probability under the reference arm (report divergence): per sweep,
-- (ref_arm, arm) pair and bucket of ref_token_prob_ref, the teacher-forced positions and the flips
-- among them. Buckets: [0, 0.1), [0.1, 0.5), [0.5, 0.9), [0.9, 1]; bucket_low is the bucket's lower
-- edge. Positions without a recorded probability or flip flag are left out (counted in
-- divergence_sequences.sql as positions - measured).
-- Parameters: $sweep (NULL for every sweep).
WITH b AS (
    SELECT sweep, ref_arm, arm, flip,
           CASE WHEN ref_token_prob_ref < 0.1 THEN 0.0
                WHEN ref_token_prob_ref < 0.5 THEN 0.1
                WHEN ref_token_prob_ref < 0.9 THEN 0.5
                ELSE 0.9 END                         AS bucket_low
    FROM teacher_forced
    WHERE ($sweep IS NULL OR sweep = $sweep) AND ref_token_prob_ref IS NOT NULL AND flip IS NOT NULL
)
SELECT sweep, ref_arm, arm, bucket_low,
       count(*)::BIGINT                          AS positions,
       count(*) FILTER (WHERE flip)::BIGINT      AS flips
FROM b
GROUP BY sweep, ref_arm, arm, bucket_low
ORDER BY sweep, ref_arm, arm, bucket_low
