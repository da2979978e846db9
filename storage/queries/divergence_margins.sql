-- First divergence with the margins around it (report divergence), one row per sweep and arm pair
-- (arm_a < arm_b, two arms of one experiment), from each restart-0 sequence's tokens and margins
-- gathered into lists in position order: what first_divergence.sql and divergence_prefix_margins.sql
-- compute from the per-position generations, without joining positions (one aggregation over the
-- generations instead of two per-position self-joins; tests/test_divergence.py compares the two).
--   contiguous        every sequence read has positions 0 .. n-1 (else read the per-position
--                     queries: a list index is a position only then)
--   prompts           the prompt indices of the pair (either arm generated something), in order
--   positions         per prompt, the positions either arm generated
--   first_divergence  per prompt, the first generated position (0-based) where the two arms' tokens
--                     differ (a position one arm did not generate differs); NULL: identical throughout
--   margin_a/_b       per diverged prompt, each arm's top-1 minus top-2 logit at its first divergence
--                     (NULL where that arm did not generate the position)
--   prefix_a/_b       every margin of each arm at the positions before the first divergence (every
--                     position of a prompt that never diverges): both arms read the same tokens there
-- Parameters: $sweep (NULL for every sweep).
WITH src AS (
    SELECT sweep, experiment, arm, prompt_index,
           list(token ORDER BY position)                               AS t,
           list(margin ORDER BY position)                              AS m,
           min(position) = 0 AND max(position) = count(*) - 1           AS contiguous
    FROM generations
    WHERE restart = 0 AND ($sweep IS NULL OR sweep = $sweep)
    GROUP BY sweep, experiment, arm, prompt_index
),
-- include: _arm_pairs
,
cmp AS (
    SELECT
        p.sweep, p.arm_a, p.arm_b, q.prompt_index,
        coalesce(x.t, []) AS ta, coalesce(y.t, []) AS tb,
        coalesce(x.m, []) AS ma, coalesce(y.m, []) AS mb,
        coalesce(x.contiguous, true) AND coalesce(y.contiguous, true) AS contiguous
    FROM pairs p
    JOIN prompts q ON q.sweep = p.sweep AND q.experiment = p.experiment
    LEFT JOIN src x ON x.sweep = p.sweep AND x.experiment = p.experiment AND x.arm = p.arm_a
        AND x.prompt_index = q.prompt_index
    LEFT JOIN src y ON y.sweep = p.sweep AND y.experiment = p.experiment AND y.arm = p.arm_b
        AND y.prompt_index = q.prompt_index
    WHERE x.arm IS NOT NULL OR y.arm IS NOT NULL
),
fd AS (
    SELECT
        *,
        greatest(len(ta), len(tb)) AS positions,
        CASE WHEN ta = tb THEN NULL
             ELSE coalesce(nullif(list_position(list_transform(range(least(len(ta), len(tb))),
                                                               lambda i: ta[i + 1] <> tb[i + 1]), true), 0) - 1,
                           least(len(ta), len(tb))) END AS first_divergence
    FROM cmp
)
SELECT
    sweep,
    arm_a,
    arm_b,
    bool_and(contiguous)                                                                  AS contiguous,
    list(prompt_index ORDER BY prompt_index)                                              AS prompts,
    list(positions ORDER BY prompt_index)                                                 AS positions,
    list(first_divergence ORDER BY prompt_index)                                          AS first_divergence,
    list(ma[first_divergence + 1] ORDER BY prompt_index) FILTER (WHERE first_divergence IS NOT NULL) AS margin_a,
    list(mb[first_divergence + 1] ORDER BY prompt_index) FILTER (WHERE first_divergence IS NOT NULL) AS margin_b,
    flatten(list(list_slice(ma, 1, coalesce(first_divergence, len(ma))) ORDER BY prompt_index))    AS prefix_a,
    flatten(list(list_slice(mb, 1, coalesce(first_divergence, len(mb))) ORDER BY prompt_index))    AS prefix_b
FROM fd
WHERE positions > 0
GROUP BY sweep, arm_a, arm_b
ORDER BY sweep, arm_a, arm_b
