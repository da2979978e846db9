-- Each sweep's question as its spec declared it and when its spec was first launched (created_at):
-- the summary lines of `report all`, in launch order.
-- Parameters: $sweep (NULL for every sweep).
SELECT sweep, question, created_at FROM sweeps
WHERE $sweep IS NULL OR sweep = $sweep
ORDER BY created_at, sweep
