-- Launches of each sweep, oldest first, with the provenance recorded at launch (JSON: host, cpu,
-- versions of the libraries): the provenance table of `report all`.
-- Parameters: $sweep (NULL for every sweep).
SELECT sweep, launch_id, status, n_units, n_ok, n_failed, provenance_json
FROM launches
WHERE $sweep IS NULL OR sweep = $sweep
ORDER BY started_at
