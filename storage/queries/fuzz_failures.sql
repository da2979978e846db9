-- Every saved fuzzing failure: the trial, its drawn and shrunk shapes, the check that failed, its
-- verdict, the first failing element (row, column, expected, observed), the operand layout and
-- exact match's input kind (NULL in rows written before they were recorded) and the artifact (a
-- path relative to the results root) that `swapcheck check replay` reproduces byte for byte.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep, experiment, kernel, dtype, seed, trial, recipe, scales,
    m, k, n, shrunk_m, shrunk_k, shrunk_n, shrink_runs,
    failed_check, verdict, first_row, first_col, first_expected, first_observed, error, artifact,
    layout, exact_inputs
FROM fuzz
WHERE artifact IS NOT NULL AND ($sweep IS NULL OR sweep = $sweep)
ORDER BY sweep, experiment, kernel, dtype, trial
