-- Self-reproducibility: per (sweep, arm), the prompts whose generated sequence is bit-identical
-- (one sequence_hash, present in every restart) across all cold restarts of the arm: identical/total.
-- identical is NULL for an arm with fewer than 2 restarts (nothing to compare). The worker
-- processes come from arm_runs: a cold restart is a fresh process, so distinct_processes
-- (distinct host, pid) should equal restarts.
-- Parameters: $sweep (NULL for every sweep).
WITH seqs AS (
    SELECT sweep, arm, restart, prompt_index, sequence_hash
    FROM sequences
    WHERE $sweep IS NULL OR sweep = $sweep
),
arm_restarts AS (
    SELECT sweep, arm, count(DISTINCT restart) AS restarts
    FROM seqs
    GROUP BY sweep, arm
),
per_prompt AS (
    SELECT
        s.sweep,
        s.arm,
        s.prompt_index,
        count(DISTINCT s.sequence_hash) = 1
            AND count(s.sequence_hash) = count(*)
            AND count(DISTINCT s.restart) = any_value(r.restarts) AS identical
    FROM seqs s
    JOIN arm_restarts r USING (sweep, arm)
    GROUP BY s.sweep, s.arm, s.prompt_index
),
runs AS (
    SELECT
        sweep,
        arm,
        string_agg(DISTINCT scales, ',' ORDER BY scales)                       AS scales,
        string_agg(DISTINCT configured_kernel, ',' ORDER BY configured_kernel) AS configured_kernel,
        list_sort(list_distinct(flatten(list(observed_kernels))))              AS observed_kernels,
        bool_and(evidence_ok)                                                  AS evidence_ok,
        count(*)::BIGINT                                                       AS runs,
        count(DISTINCT pid)::BIGINT                                            AS distinct_pids,
        count(DISTINCT (host, pid))::BIGINT                                    AS distinct_processes,
        list_sort(list_distinct(list(pid)))                                    AS pids,
        list_sort(list_distinct(list(host)))                                   AS hosts,
        list_sort(list_distinct(list(host || ':' || pid)))                     AS processes
    FROM arm_runs
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY sweep, arm
)
SELECT
    p.sweep,
    p.arm,
    any_value(ru.scales)                                                       AS scales,
    any_value(ru.configured_kernel)                                            AS configured_kernel,
    any_value(r.restarts)::BIGINT                                              AS restarts,
    CASE WHEN any_value(r.restarts) >= 2
         THEN count(*) FILTER (WHERE p.identical) END::BIGINT                  AS identical,
    count(*)::BIGINT                                                           AS total,
    coalesce(list(p.prompt_index ORDER BY p.prompt_index) FILTER (WHERE NOT p.identical),
             [])                                                               AS nonidentical_prompts,
    any_value(ru.runs)                                                         AS runs,
    any_value(ru.distinct_pids)                                                AS distinct_pids,
    any_value(ru.distinct_processes)                                           AS distinct_processes,
    any_value(ru.pids)                                                         AS pids,
    any_value(ru.hosts)                                                        AS hosts,
    any_value(ru.processes)                                                    AS processes,
    any_value(ru.evidence_ok)                                                  AS evidence_ok,
    any_value(ru.observed_kernels)                                             AS observed_kernels
FROM per_prompt p
JOIN arm_restarts r USING (sweep, arm)
LEFT JOIN runs ru USING (sweep, arm)
GROUP BY p.sweep, p.arm
ORDER BY p.sweep, p.arm
