-- The coverage table of the fuzzing hunts: per (sweep, experiment, kernel, dtype) and boundary class
-- (tasks.checks.fuzz.boundary_classes: K at 2^j-1 / 2^j / 2^j+1 or "K other", "K > 4096", M and N at
-- tile sizes t-1 / t / t+1 or "other", N's tail against 16-column tiles, the operand layout), how many
-- trials hit the class (a trial hits several) and how many of those failed (a verdict other than the
-- passing ones: IDENTICAL, EPILOGUE_ROUNDING, WITHIN_ALGORITHM_BOUND).
-- Rows written before issue 26 have no classes and are not counted.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    experiment,
    kernel,
    dtype,
    cls                                                                  AS class,
    count(*)                                                             AS trials,
    count(*) FILTER (WHERE verdict NOT IN ('IDENTICAL', 'EPILOGUE_ROUNDING', 'WITHIN_ALGORITHM_BOUND')) AS failed
FROM (SELECT *, unnest(classes) AS cls FROM fuzz WHERE classes IS NOT NULL AND ($sweep IS NULL OR sweep = $sweep))
GROUP BY sweep, experiment, kernel, dtype, cls
ORDER BY sweep, experiment, kernel, dtype, cls
