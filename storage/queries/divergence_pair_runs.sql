-- Total agreement of all 2N runs of an arm pair (report divergence): per sweep, arm pair (arm_a <
-- arm_b, two arms of one experiment) and prompt, the completions of both arms' cold restarts: runs (sequences present, both
-- arms), distinct_completions (distinct sequence_hash among them) and whether every run of both arms
-- is present (complete) with one prompt_hash (same_prompt). TARr@2N counts the prompts with
-- complete AND same_prompt AND distinct_completions = 1. For prompts with an expected answer:
-- answered_runs (runs with an extracted_answer) and distinct_answers; TARa@2N counts the prompts with
-- complete AND same_prompt AND answered_runs = runs AND distinct_answers = 1.
-- Parameters: $sweep (NULL for every sweep).
WITH seqs AS (
    SELECT sweep, experiment, arm, restart, prompt_index, prompt_hash, sequence_hash, extracted_answer
    FROM sequences
    WHERE $sweep IS NULL OR sweep = $sweep
),
arm_restarts AS (
    SELECT sweep, experiment, arm, count(DISTINCT restart) AS restarts
    FROM seqs
    GROUP BY sweep, experiment, arm
),
pairs AS (
    SELECT a.sweep, a.experiment, a.arm AS arm_a, b.arm AS arm_b, a.restarts AS restarts_a, b.restarts AS restarts_b
    FROM arm_restarts a
    JOIN arm_restarts b ON a.sweep = b.sweep AND a.experiment = b.experiment AND a.arm < b.arm
)
SELECT
    p.sweep,
    p.arm_a,
    p.arm_b,
    s.prompt_index,
    any_value(p.restarts_a)::BIGINT                                                  AS restarts_a,
    any_value(p.restarts_b)::BIGINT                                                  AS restarts_b,
    count(*)::BIGINT                                                                 AS runs,
    count(DISTINCT s.sequence_hash)::BIGINT                                          AS distinct_completions,
    count(DISTINCT (s.arm, s.restart)) = any_value(p.restarts_a) + any_value(p.restarts_b)
        AND count(s.sequence_hash) = count(*)                                        AS complete,
    count(DISTINCT s.prompt_hash) = 1                                                AS same_prompt,
    count(s.extracted_answer)::BIGINT                                                AS answered_runs,
    count(DISTINCT s.extracted_answer)::BIGINT                                       AS distinct_answers
FROM pairs p
JOIN seqs s ON s.sweep = p.sweep AND s.experiment = p.experiment AND s.arm IN (p.arm_a, p.arm_b)
GROUP BY p.sweep, p.arm_a, p.arm_b, s.prompt_index
ORDER BY p.sweep, p.arm_a, p.arm_b, s.prompt_index
