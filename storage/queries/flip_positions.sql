-- Teacher-forced positions for the flip-risk model (reports/fliprisk.py): one row per scored
-- position with the reference margin and the flip flag. sequence_id numbers the reference
-- sequences (sweep, ref_arm, ref_restart, prompt_index), the unit the bootstrap resamples;
-- pair_id numbers the (sweep, ref_arm, arm) pairs.
-- Parameters: $sweep, $ref_arm, $arm (NULL for all).
SELECT
    sweep,
    ref_arm,
    arm,
    ref_restart,
    prompt_index,
    position,
    ref_margin,
    flip,
    ref_token,
    ref_argmax,
    (dense_rank() OVER (ORDER BY sweep, ref_arm, ref_restart, prompt_index) - 1)::BIGINT AS sequence_id,
    (dense_rank() OVER (ORDER BY sweep, ref_arm, arm) - 1)::BIGINT                      AS pair_id
FROM teacher_forced
WHERE ($sweep IS NULL OR sweep = $sweep)
  AND ($ref_arm IS NULL OR ref_arm = $ref_arm)
  AND ($arm IS NULL OR arm = $arm)
ORDER BY sweep, ref_arm, arm, ref_restart, prompt_index, position
