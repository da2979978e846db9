-- Batch invariance across torch thread counts (kind batch_invariance, level kernel; the CPU analogue
-- of a tensor-parallel size): one row per (sweep, experiment, kernel, dtype, out_dtype, scale_mode, k,
-- n, threads) for the thread counts after a unit's first. cells: (seed, M, position) cells compared
-- with the same cell at the unit's first thread count (first_threads); cells_differing: cells whose
-- probe output row differs from it; differing / elements: output elements; max_spacing: the largest
-- distance in output spacings. Units run at one thread count (or written before issue #26) have no
-- row here.
-- Parameters: $sweep (NULL for every sweep).
WITH firsts AS (  -- a unit's first thread count: the one whose rows compare with no other
    SELECT unit_id, min(threads) FILTER (WHERE thread_differing IS NULL) AS first_threads
    FROM batch_invariance
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY unit_id
)
SELECT
    b.sweep,
    b.experiment,
    b.kernel,
    b.dtype,
    b.out_dtype,
    b.scale_mode,
    b.k,
    b.n,
    any_value(f.first_threads)::BIGINT                           AS first_threads,
    b.threads,
    count(*)::BIGINT                                             AS cells,
    count(*) FILTER (WHERE b.thread_differing > 0)::BIGINT       AS cells_differing,
    sum(b.elements)::BIGINT                                      AS elements,
    sum(b.thread_differing)::BIGINT                              AS differing,
    max(b.thread_max_spacing)::BIGINT                            AS max_spacing
FROM batch_invariance b
JOIN firsts f USING (unit_id)
WHERE ($sweep IS NULL OR b.sweep = $sweep) AND b.thread_differing IS NOT NULL
GROUP BY b.sweep, b.experiment, b.kernel, b.dtype, b.out_dtype, b.scale_mode, b.k, b.n, b.threads
ORDER BY b.sweep, b.experiment, b.kernel, b.dtype, b.out_dtype, b.scale_mode, b.k, b.n, b.threads
