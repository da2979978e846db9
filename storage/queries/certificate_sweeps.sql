-- The sweeps that have results a certificate reads (kdepth, replay, sequences, exact_match, bounds,
-- attention_replay),
-- whether or not they have a spec record: `report certificate` gives each its own certificates.
-- Parameters: $sweep (NULL for every sweep).
SELECT DISTINCT sweep FROM (
    SELECT sweep FROM kdepth
    UNION ALL SELECT sweep FROM replay
    UNION ALL SELECT sweep FROM sequences
    UNION ALL SELECT sweep FROM exact_match
    UNION ALL SELECT sweep FROM bounds
    UNION ALL SELECT sweep FROM attention_replay
)
WHERE $sweep IS NULL OR sweep = $sweep
ORDER BY sweep
