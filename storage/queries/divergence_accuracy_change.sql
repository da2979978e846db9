-- The accuracy change of a kernel swap (report divergence): per sweep, experiment and arm pair of that
-- experiment (arm_a < arm_b), the restart-0 sequences of both arms paired on the same prompt
-- (prompt_index and prompt_hash), over the prompts with an expected answer (`correct` not NULL):
-- n paired prompts, a_only (right under arm_a, wrong under arm_b), b_only (the reverse), both_right,
-- answers_differ (extracted answers not identical), and prompts_a / prompts_b (each arm's checked
-- restart-0 prompts, paired or not). The change is (b_only - a_only) / n; the exact McNemar test is
-- the two-sided binomial test of b_only among the a_only + b_only discordant prompts at p = 0.5.
-- Arm pairs across two experiments compare two models, not a swap: they come as rows with
-- same_experiment = false and no counts.
-- Parameters: $sweep (NULL for every sweep).
WITH seqs AS (
    SELECT sweep, experiment, arm, prompt_index, prompt_hash, extracted_answer, correct
    FROM sequences
    WHERE ($sweep IS NULL OR sweep = $sweep) AND restart = 0 AND correct IS NOT NULL
),
arms AS (
    SELECT sweep, experiment, arm, count(*) AS prompts FROM seqs GROUP BY sweep, experiment, arm
),
paired AS (
    SELECT a.sweep, a.experiment, a.arm AS arm_a, b.arm AS arm_b,
           count(*)                                                      AS n,
           count(*) FILTER (WHERE a.correct AND NOT b.correct)           AS a_only,
           count(*) FILTER (WHERE b.correct AND NOT a.correct)           AS b_only,
           count(*) FILTER (WHERE a.correct AND b.correct)               AS both_right,
           count(*) FILTER (WHERE a.extracted_answer IS DISTINCT FROM b.extracted_answer) AS answers_differ
    FROM seqs a
    JOIN seqs b ON a.sweep = b.sweep AND a.experiment = b.experiment AND a.prompt_index = b.prompt_index
               AND a.prompt_hash = b.prompt_hash AND a.arm < b.arm
    GROUP BY a.sweep, a.experiment, a.arm, b.arm
)
SELECT x.sweep, x.experiment AS experiment_a, y.experiment AS experiment_b, x.arm AS arm_a, y.arm AS arm_b,
       x.experiment = y.experiment                  AS same_experiment,
       x.prompts::BIGINT                            AS prompts_a,
       y.prompts::BIGINT                            AS prompts_b,
       p.n::BIGINT                                  AS n,
       p.a_only::BIGINT                             AS a_only,
       p.b_only::BIGINT                             AS b_only,
       p.both_right::BIGINT                         AS both_right,
       p.answers_differ::BIGINT                     AS answers_differ
FROM arms x
JOIN arms y ON x.sweep = y.sweep AND x.arm < y.arm
LEFT JOIN paired p ON p.sweep = x.sweep AND p.experiment = x.experiment AND x.experiment = y.experiment
                  AND p.arm_a = x.arm AND p.arm_b = y.arm
ORDER BY x.sweep, x.experiment, y.experiment, x.arm, y.arm
