-- Answers of an answer-checked model (report divergence): per (sweep, arm), over the sequences whose
-- prompt has an expected answer (`extracted_answer` and `correct` recorded; NULL for other prompts and
-- in results written before the columns existed): checked sequences (every restart) and the correct
-- ones (accuracy = correct / checked); prompts: prompts with an extracted answer in every restart of
-- the arm; agreeing_prompts: those whose N extracted answers are identical token for token (TARa@N =
-- agreeing_prompts / prompts); restarts: N.
-- Parameters: $sweep (NULL for every sweep).
WITH seqs AS (
    SELECT sweep, arm, restart, prompt_index, extracted_answer, correct
    FROM sequences
    WHERE ($sweep IS NULL OR sweep = $sweep)
),
arm_restarts AS (
    SELECT sweep, arm, count(DISTINCT restart) AS restarts FROM seqs GROUP BY sweep, arm
),
per_prompt AS (
    SELECT s.sweep, s.arm, s.prompt_index,
           count(DISTINCT s.restart) = any_value(r.restarts)
               AND count(s.extracted_answer) = count(*)                    AS complete,
           count(DISTINCT s.extracted_answer) = 1                         AS agreeing
    FROM seqs s
    JOIN arm_restarts r USING (sweep, arm)
    WHERE s.extracted_answer IS NOT NULL OR s.correct IS NOT NULL
    GROUP BY s.sweep, s.arm, s.prompt_index
),
counts AS (
    SELECT sweep, arm, count(correct) AS checked, count(*) FILTER (WHERE correct) AS correct
    FROM seqs GROUP BY sweep, arm
)
SELECT r.sweep, r.arm,
       any_value(r.restarts)::BIGINT                                                  AS restarts,
       any_value(c.checked)::BIGINT                                                   AS checked,
       any_value(c.correct)::BIGINT                                                   AS correct,
       count(p.prompt_index) FILTER (WHERE p.complete)::BIGINT                        AS prompts,
       count(p.prompt_index) FILTER (WHERE p.complete AND p.agreeing)::BIGINT         AS agreeing_prompts
FROM arm_restarts r
JOIN counts c USING (sweep, arm)
LEFT JOIN per_prompt p USING (sweep, arm)
GROUP BY r.sweep, r.arm
ORDER BY r.sweep, r.arm
