-- Teacher-forced arm pairs: per sweep, each (ref_arm, arm) pair with its scored positions, and the
-- counts the certificate's flip figures are: `kept` positions (a flip flag and a finite, non-negative
-- reference margin: what reports.fliprisk.load keeps), `flips` among them, `dropped` (the rest).
-- Parameters: $sweep (NULL for every sweep).
SELECT sweep, ref_arm, arm, count(*)::BIGINT AS positions,
       count(*) FILTER (WHERE flip IS NOT NULL AND isfinite(ref_margin) AND ref_margin >= 0)::BIGINT AS kept,
       count(*) FILTER (WHERE flip AND isfinite(ref_margin) AND ref_margin >= 0)::BIGINT AS flips,
       count(*) FILTER (WHERE flip IS NULL OR ref_margin IS NULL OR NOT isfinite(ref_margin)
                        OR ref_margin < 0)::BIGINT AS dropped
FROM teacher_forced
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, ref_arm, arm
ORDER BY sweep, ref_arm, arm
