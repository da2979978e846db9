-- Teacher-forced arm pairs: per sweep, each (ref_arm, arm) pair with its scored positions. The
-- certificate reads each pair's flips alone (reports.fliprisk.load with that ref_arm and arm).
-- Parameters: $sweep (NULL for every sweep).
SELECT sweep, ref_arm, arm, count(*)::BIGINT AS positions
FROM teacher_forced
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, ref_arm, arm
ORDER BY sweep, ref_arm, arm
