-- Kernel check verdicts: per (sweep, check table, kernel, output dtype), the distinct verdicts of
-- every trial and shape (exact_match and bounds; fuzz: every fuzz trial, each judged by both; precision:
-- every family and draw of the precision-downgrade probe). The worst one (reports.conformance.worst_verdict,
-- in the order of tasks/verdicts.py) is what `report conformance`, `report all` and the nightly
-- metrics show. Rows come exact_match first, then bounds, then fuzz, then precision, each by kernel and dtype.
-- Parameters: $sweep (NULL for every sweep).
SELECT sweep, "check", kernel, dtype, verdicts
FROM (
    SELECT sweep, 'exact_match' AS "check", 0 AS check_order, kernel, dtype,
           list(DISTINCT verdict ORDER BY verdict) AS verdicts
    FROM exact_match
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY sweep, kernel, dtype
    UNION ALL
    SELECT sweep, 'bounds' AS "check", 1 AS check_order, kernel, dtype,
           list(DISTINCT verdict ORDER BY verdict) AS verdicts
    FROM bounds
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY sweep, kernel, dtype
    UNION ALL
    SELECT sweep, 'fuzz' AS "check", 2 AS check_order, kernel, dtype,
           list(DISTINCT verdict ORDER BY verdict) AS verdicts
    FROM fuzz
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY sweep, kernel, dtype
    UNION ALL
    SELECT sweep, 'precision' AS "check", 3 AS check_order, kernel, dtype,
           list(DISTINCT verdict ORDER BY verdict) AS verdicts
    FROM precision
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY sweep, kernel, dtype
)
ORDER BY sweep, check_order, kernel, dtype
