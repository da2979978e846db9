-- Fuzzing per (sweep, experiment, kernel, dtype): trials run, the seed and budget, trials per
-- verdict of each check (exact match on binary or cancelling-runs inputs, bounds), failures saved (rows with an
-- artifact) and kernel errors. One row per hunt; the trials themselves are in the fuzz table.
-- Columns: trials, seconds (sum of trial times), em_* / bounds_* (trials whose check said
-- IDENTICAL / a worse verdict), failures (trials with a saved artifact), errors (trials whose kernel raised).
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    experiment,
    kernel,
    dtype,
    any_value(seed)                                                      AS seed,
    any_value(budget_s)                                                  AS budget_s,
    count(*)                                                             AS trials,
    sum(seconds)                                                         AS seconds,
    count(*) FILTER (WHERE exact_match_verdict = 'IDENTICAL')            AS em_identical,
    count(*) FILTER (WHERE exact_match_verdict <> 'IDENTICAL')           AS em_not_identical,
    count(*) FILTER (WHERE bounds_verdict = 'IDENTICAL')                 AS bounds_identical,
    count(*) FILTER (WHERE bounds_verdict <> 'IDENTICAL')                AS bounds_not_identical,
    list(DISTINCT verdict ORDER BY verdict)                              AS verdicts,
    count(*) FILTER (WHERE artifact IS NOT NULL)                         AS failures,
    count(*) FILTER (WHERE error IS NOT NULL)                            AS errors
FROM fuzz
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, experiment, kernel, dtype
ORDER BY sweep, experiment, kernel, dtype
