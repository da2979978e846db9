-- Answers of an answer-checked model (report divergence; needs the sequences table's `correct`
-- column, written by the generate kind for prompts with an expected answer): per (sweep, arm),
-- checked: sequences whose `correct` is recorded (every restart), correct: those answered right;
-- prompts: prompts with every restart present and `correct` recorded in each; agreeing_prompts: those
-- whose N runs are all correct or all one sequence (both give one answer in all N runs: a lower
-- bound on TARa@N, the extracted answer itself not being recorded).
-- Parameters: $sweep (NULL for every sweep).
WITH seqs AS (
    SELECT sweep, arm, restart, prompt_index, sequence_hash, correct
    FROM sequences
    WHERE $sweep IS NULL OR sweep = $sweep
),
arm_restarts AS (
    SELECT sweep, arm, count(DISTINCT restart) AS restarts FROM seqs GROUP BY sweep, arm
),
per_prompt AS (
    SELECT s.sweep, s.arm, s.prompt_index,
           count(DISTINCT s.restart) = any_value(r.restarts) AND count(s.correct) = count(*) AS complete,
           bool_and(s.correct) OR count(DISTINCT s.sequence_hash) = 1                   AS agreeing
    FROM seqs s
    JOIN arm_restarts r USING (sweep, arm)
    GROUP BY s.sweep, s.arm, s.prompt_index
)
SELECT s.sweep, s.arm,
       count(s.correct)::BIGINT                                          AS checked,
       count(*) FILTER (WHERE s.correct)::BIGINT                         AS correct,
       any_value(p.prompts)::BIGINT                                      AS prompts,
       any_value(p.agreeing_prompts)::BIGINT                             AS agreeing_prompts
FROM seqs s
JOIN (SELECT sweep, arm, count(*) FILTER (WHERE complete) AS prompts,
             count(*) FILTER (WHERE complete AND agreeing) AS agreeing_prompts
      FROM per_prompt GROUP BY sweep, arm) p USING (sweep, arm)
GROUP BY s.sweep, s.arm
ORDER BY s.sweep, s.arm
