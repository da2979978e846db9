-- Teacher-forced positions for the flip-risk model (reports/fliprisk.py): one row per scored position of
-- the selected (sweep, ref_arm, arm) pairs, in no particular order (the report orders each pair itself,
-- by ref_restart, prompt_index, position). pair_id numbers the pairs in (sweep, ref_arm, arm) order; a
-- reference sequence, the unit the bootstrap resamples, is (sweep, ref_arm, ref_restart, prompt_index).
-- ref_mismatch: the reference arm's own argmax is not the token it generated (false when either is NULL).
-- The pair ids are numbered over the few distinct keys and joined back (cheaper than a window over every
-- position); IS NOT DISTINCT FROM keeps rows with a NULL key, numbered like any other key.
-- One pair of known keys is read with flip_pair_positions (these rows, without the numbering join).
-- Parameters: $sweep, $ref_arm, $arm (NULL for all).
WITH pairs AS (
    SELECT sweep, ref_arm, arm, (row_number() OVER (ORDER BY sweep, ref_arm, arm) - 1)::BIGINT AS pair_id
    FROM (SELECT DISTINCT sweep, ref_arm, arm
          FROM teacher_forced
          WHERE ($sweep IS NULL OR sweep = $sweep)
            AND ($ref_arm IS NULL OR ref_arm = $ref_arm)
            AND ($arm IS NULL OR arm = $arm))
)
SELECT p.pair_id, t.sweep, t.ref_arm, t.arm, t.ref_restart, t.prompt_index, t.position, t.ref_margin, t.flip,
       coalesce(t.ref_token <> t.ref_argmax, false) AS ref_mismatch
FROM teacher_forced AS t
JOIN pairs AS p ON t.sweep IS NOT DISTINCT FROM p.sweep AND t.ref_arm IS NOT DISTINCT FROM p.ref_arm
               AND t.arm IS NOT DISTINCT FROM p.arm
WHERE ($sweep IS NULL OR t.sweep = $sweep)
  AND ($ref_arm IS NULL OR t.ref_arm = $ref_arm)
  AND ($arm IS NULL OR t.arm = $arm)
