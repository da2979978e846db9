-- Per-position agreement: per sweep, arm pair (arm_a < arm_b) and generated position (0-based), the
-- prompts whose restart-0 tokens agree at that position (agreeing/prompts = agreement), and those
-- whose sequences are still identical up to and including it (identical_prefix/prompts =
-- prefix_agreement). prompts counts the prompts that either arm generated to that position.
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
SELECT
    c.sweep,
    c.arm_a,
    c.arm_b,
    c.position,
    count(*)::BIGINT                                                        AS prompts,
    count(*) FILTER (WHERE NOT c.differs)::BIGINT                           AS agreeing,
    count(*) FILTER (WHERE NOT c.differs) / count(*)                        AS agreement,
    count(*) FILTER (WHERE f.first_divergence IS NULL
                        OR f.first_divergence > c.position)::BIGINT         AS identical_prefix,
    count(*) FILTER (WHERE f.first_divergence IS NULL
                        OR f.first_divergence > c.position) / count(*)      AS prefix_agreement
FROM cmp c
JOIN first_div f USING (sweep, arm_a, arm_b, prompt_index)
GROUP BY c.sweep, c.arm_a, c.arm_b, c.position
ORDER BY c.sweep, c.arm_a, c.arm_b, c.position
