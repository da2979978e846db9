-- Ledger summary per sweep and status, with the first error of each failed group.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    kind,
    status,
    count(*)::BIGINT          AS units,
    sum(attempts)::BIGINT     AS attempts,
    sum(rows)::BIGINT         AS rows,
    round(sum(duration_s), 2) AS seconds,
    min(error)                AS example_error
FROM units
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY ALL
ORDER BY sweep, kind, status
