-- Each sweep's spec record as launched (the TOML text), for checks of what a spec declared.
-- Parameters: $sweep (NULL for every sweep).
SELECT sweep, spec_toml FROM sweeps
WHERE $sweep IS NULL OR sweep = $sweep
ORDER BY sweep
