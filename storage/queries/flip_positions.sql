-- Teacher-forced positions for the flip-risk model (reports/fliprisk.py): one row per scored
-- position with the reference margin and the flip flag. sequence_id numbers the reference
-- sequences (sweep, ref_arm, ref_restart, prompt_index), the unit the bootstrap resamples;
-- pair_id numbers the (sweep, ref_arm, arm) pairs.
-- The ids are numbered over the few distinct keys and joined back (cheaper than a window over
-- every position); IS NOT DISTINCT FROM keeps rows with a NULL key, numbered like dense_rank would.
-- Parameters: $sweep, $ref_arm, $arm (NULL for all).
WITH t AS MATERIALIZED (
    SELECT sweep, ref_arm, arm, ref_restart, prompt_index, position, ref_margin, flip, ref_token, ref_argmax
    FROM teacher_forced
    WHERE ($sweep IS NULL OR sweep = $sweep)
      AND ($ref_arm IS NULL OR ref_arm = $ref_arm)
      AND ($arm IS NULL OR arm = $arm)
), seqs AS (
    SELECT sweep, ref_arm, ref_restart, prompt_index,
           (row_number() OVER (ORDER BY sweep, ref_arm, ref_restart, prompt_index) - 1)::BIGINT AS sequence_id
    FROM (SELECT DISTINCT sweep, ref_arm, ref_restart, prompt_index FROM t)
), pairs AS (
    SELECT sweep, ref_arm, arm, (row_number() OVER (ORDER BY sweep, ref_arm, arm) - 1)::BIGINT AS pair_id
    FROM (SELECT DISTINCT sweep, ref_arm, arm FROM t)
)
SELECT t.sweep, t.ref_arm, t.arm, t.ref_restart, t.prompt_index, t.position, t.ref_margin, t.flip,
       t.ref_token, t.ref_argmax, s.sequence_id, p.pair_id
FROM t
JOIN seqs AS s ON t.sweep IS NOT DISTINCT FROM s.sweep AND t.ref_arm IS NOT DISTINCT FROM s.ref_arm
              AND t.ref_restart IS NOT DISTINCT FROM s.ref_restart AND t.prompt_index IS NOT DISTINCT FROM s.prompt_index
JOIN pairs AS p ON t.sweep IS NOT DISTINCT FROM p.sweep AND t.ref_arm IS NOT DISTINCT FROM p.ref_arm
               AND t.arm IS NOT DISTINCT FROM p.arm
ORDER BY t.sweep, t.ref_arm, t.arm, t.ref_restart, t.prompt_index, t.position
