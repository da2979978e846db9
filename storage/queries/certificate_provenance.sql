-- Provenance of a certificate: per sweep and launch (oldest first), the spec hash the launch ran, its
-- status and the provenance recorded at launch (JSON: host, cpu, platform, library versions); the
-- same rows as `launches` plus spec_sha256 and the launch times. reports.certificate reads it.
-- Parameters: $sweep (NULL for every sweep).
SELECT sweep, launch_id, spec_sha256, started_at, finished_at, status, n_units, n_ok, n_failed, provenance_json
FROM launches
WHERE $sweep IS NULL OR sweep = $sweep
ORDER BY sweep, started_at
