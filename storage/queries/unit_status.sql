-- Ledger summary per sweep and status, with the first error of each failed group. damaged counts the
-- units whose committed files the catalog found missing or damaged (their rows are not read; see
-- `swapcheck sweep verify`).
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    kind,
    status,
    count(*)::BIGINT          AS units,
    sum(attempts)::BIGINT     AS attempts,
    sum(rows)::BIGINT         AS rows,
    round(sum(duration_s), 2) AS seconds,
    count(*) FILTER (WHERE damaged)::BIGINT AS damaged,
    min(error)                AS example_error
FROM units
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY ALL
ORDER BY sweep, kind, status
