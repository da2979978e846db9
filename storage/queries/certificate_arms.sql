-- Generate arms of a sweep for the certificate: per (sweep, arm), the configured kernel, scale mode,
-- model, engine, the distinct weight hashes of its cold restarts (provenance) and
-- whether every restart's kernel evidence was ok.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    arm,
    string_agg(DISTINCT configured_kernel, ',' ORDER BY configured_kernel) AS kernel,
    string_agg(DISTINCT scales, ',' ORDER BY scales)                       AS scales,
    string_agg(DISTINCT model, ',' ORDER BY model)                         AS model,
    string_agg(DISTINCT engine, ',' ORDER BY engine)                       AS engine,
    list_sort(list_distinct(list(weights_sha256)))                         AS weights_sha256,
    bool_and(evidence_ok)                                                  AS evidence_ok
FROM arm_runs
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, arm
ORDER BY sweep, arm
