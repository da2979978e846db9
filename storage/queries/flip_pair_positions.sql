-- One teacher-forced (sweep, ref_arm, arm) pair's positions for the flip-risk model (reports/fliprisk.py):
-- the rows and columns of flip_positions for that pair, without pair_id and the keys, in no particular
-- order (the report orders them by ref_restart, prompt_index, position). The keys match exactly: a NULL
-- parameter selects nothing (a pair with a NULL key is read through flip_positions).
-- Parameters: $sweep, $ref_arm, $arm.
SELECT ref_restart, prompt_index, position, ref_margin, flip,
       coalesce(ref_token <> ref_argmax, false) AS ref_mismatch
FROM teacher_forced
WHERE sweep = $sweep AND ref_arm = $ref_arm AND arm = $arm
