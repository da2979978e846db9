-- How often each W8A8 linear is named by the localize kind, per (sweep, experiment, arm pair):
-- in_culprit = diverging prompts whose 1-minimal culprit set contains the linear, alone = those
-- whose set is exactly that linear, first_diff = prompts where it is the first linear (forward
-- order) whose output hash differs between the arms teacher-forced on the same prefix.
-- Parameters: $sweep (NULL for every sweep).
WITH named AS (
    SELECT sweep, experiment, pair, unnest(culprit) AS linear, culprit_size, NULL::VARCHAR AS first
    FROM localize WHERE culprit IS NOT NULL AND ($sweep IS NULL OR sweep = $sweep)
    UNION ALL
    SELECT sweep, experiment, pair, first_diff_linear AS linear, NULL AS culprit_size, first_diff_linear AS first
    FROM localize WHERE first_diff_linear IS NOT NULL AND ($sweep IS NULL OR sweep = $sweep)
)
SELECT
    sweep, experiment, pair, linear,
    count(*) FILTER (WHERE first IS NULL)                       AS in_culprit,
    count(*) FILTER (WHERE first IS NULL AND culprit_size = 1)  AS alone,
    count(*) FILTER (WHERE first IS NOT NULL)                   AS first_diff
FROM named
GROUP BY sweep, experiment, pair, linear
ORDER BY sweep, experiment, pair, in_culprit DESC, first_diff DESC, linear
