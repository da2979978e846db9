-- Distinct completions in N runs (the generate kind): per (sweep, arm), how many distinct greedy
-- sequences (distinct sequence_hash) the arm's N cold restarts produced for each prompt. restarts: N
-- (distinct restarts of the arm); prompts: prompts generated; max_distinct / mean_distinct: over
-- prompts; prompts_several: prompts with more than one distinct completion; distribution: one
-- {distinct, prompts} entry per count of distinct completions (how many prompts had 1, 2, ... of them).
-- prompts_incomplete: prompts missing from some restart (their count is over the runs present).
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
        s.sweep, s.arm, s.prompt_index,
        count(DISTINCT s.sequence_hash)                              AS distinct_completions,
        count(DISTINCT s.restart) < any_value(r.restarts)            AS incomplete
    FROM seqs s
    JOIN arm_restarts r USING (sweep, arm)
    GROUP BY s.sweep, s.arm, s.prompt_index
),
hist AS (
    SELECT sweep, arm, distinct_completions, count(*) AS prompts
    FROM per_prompt
    GROUP BY sweep, arm, distinct_completions
),
dist AS (
    SELECT sweep, arm,
           list({'distinct': distinct_completions::BIGINT, 'prompts': prompts::BIGINT}
                ORDER BY distinct_completions) AS distribution
    FROM hist
    GROUP BY sweep, arm
)
SELECT
    p.sweep,
    p.arm,
    any_value(r.restarts)::BIGINT                                    AS restarts,
    count(*)::BIGINT                                                 AS prompts,
    max(p.distinct_completions)::BIGINT                              AS max_distinct,
    avg(p.distinct_completions)                                      AS mean_distinct,
    count(*) FILTER (WHERE p.distinct_completions > 1)::BIGINT       AS prompts_several,
    count(*) FILTER (WHERE p.incomplete)::BIGINT                     AS prompts_incomplete,
    any_value(d.distribution)                                        AS distribution
FROM per_prompt p
JOIN arm_restarts r USING (sweep, arm)
JOIN dist d USING (sweep, arm)
GROUP BY p.sweep, p.arm
ORDER BY p.sweep, p.arm
