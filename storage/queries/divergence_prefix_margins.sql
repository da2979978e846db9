-- Margins where two arms' restart-0 generations are still identical (report divergence): per sweep,
-- arm pair (arm_a < arm_b) and prompt, every generated position before the pair's first divergence
-- (every position of a sequence that never diverges), with each arm's top-1 minus top-2 logit there.
-- Both arms read the same prefix at these positions, so their margins are comparable with the
-- margins at the first divergence (first_divergence.sql).
-- Parameters: $sweep (NULL for every sweep).
-- Method: the arm pairs of _generation_pairs.sql.
WITH
-- include: _generation_pairs
,
first_div AS (
    SELECT sweep, arm_a, arm_b, prompt_index, min(position) FILTER (WHERE differs) AS first_divergence
    FROM cmp
    GROUP BY sweep, arm_a, arm_b, prompt_index
)
SELECT c.sweep, c.arm_a, c.arm_b, c.prompt_index, c.position, c.margin_a, c.margin_b
FROM cmp c
JOIN first_div f USING (sweep, arm_a, arm_b, prompt_index)
WHERE f.first_divergence IS NULL OR c.position < f.first_divergence
ORDER BY c.sweep, c.arm_a, c.arm_b, c.prompt_index, c.position
