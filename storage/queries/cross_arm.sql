-- Cross-arm agreement: per sweep and arm pair (arm_a < arm_b by name; two arms of one experiment:
-- arms of two experiments run other models or prompts and are never paired), the prompts whose restart-0
-- generated sequences are bit-identical (same prompt_hash and sequence_hash): identical/total.
-- total counts every prompt either arm generated; a prompt missing from one arm, or generated from a
-- different prompt (prompt_mismatch), is not identical. Scales and kernels come from arm_runs;
-- same_scales marks pairs compared under the same scale mode (real vs real, pow2 vs pow2).
-- attention_a/attention_b: each arm's attention kernel (NULL in results written before arms had one).
-- Parameters: $sweep (NULL for every sweep).
WITH src AS (
    SELECT sweep, experiment, arm, prompt_index, prompt_hash, sequence_hash
    FROM sequences
    WHERE restart = 0 AND ($sweep IS NULL OR sweep = $sweep)
),
-- include: _arm_pairs
,
runs AS (
    SELECT
        sweep,
        arm,
        string_agg(DISTINCT scales, ',' ORDER BY scales)                       AS scales,
        string_agg(DISTINCT configured_kernel, ',' ORDER BY configured_kernel) AS kernel,
        string_agg(DISTINCT attention, ',' ORDER BY attention)                 AS attention
    FROM arm_runs
    WHERE $sweep IS NULL OR sweep = $sweep
    GROUP BY sweep, arm
),
cmp AS (
    SELECT
        p.sweep,
        p.arm_a,
        p.arm_b,
        q.prompt_index,
        x.prompt_hash IS NOT NULL AND y.prompt_hash IS NOT NULL
            AND x.prompt_hash IS DISTINCT FROM y.prompt_hash                  AS prompt_mismatch,
        x.sequence_hash IS NOT NULL AND x.sequence_hash = y.sequence_hash
            AND x.prompt_hash IS NOT DISTINCT FROM y.prompt_hash              AS identical,
        x.arm IS NULL OR y.arm IS NULL                                        AS missing
    FROM pairs p
    JOIN prompts q ON q.sweep = p.sweep AND q.experiment = p.experiment
    LEFT JOIN src x ON x.sweep = p.sweep AND x.experiment = p.experiment AND x.arm = p.arm_a
        AND x.prompt_index = q.prompt_index
    LEFT JOIN src y ON y.sweep = p.sweep AND y.experiment = p.experiment AND y.arm = p.arm_b
        AND y.prompt_index = q.prompt_index
    WHERE x.arm IS NOT NULL OR y.arm IS NOT NULL
)
SELECT
    c.sweep,
    c.arm_a,
    c.arm_b,
    any_value(ra.scales)                                                  AS scales_a,
    any_value(rb.scales)                                                  AS scales_b,
    any_value(ra.scales) IS NOT DISTINCT FROM any_value(rb.scales)        AS same_scales,
    any_value(ra.kernel)                                                  AS kernel_a,
    any_value(rb.kernel)                                                  AS kernel_b,
    any_value(ra.attention)                                               AS attention_a,
    any_value(rb.attention)                                               AS attention_b,
    count(*) FILTER (WHERE c.identical)::BIGINT                           AS identical,
    count(*)::BIGINT                                                      AS total,
    count(*) FILTER (WHERE c.prompt_mismatch)::BIGINT                     AS prompt_mismatch,
    count(*) FILTER (WHERE c.missing)::BIGINT                             AS missing,
    coalesce(list(c.prompt_index ORDER BY c.prompt_index) FILTER (WHERE NOT c.identical),
             [])                                                          AS differing_prompts
FROM cmp c
LEFT JOIN runs ra ON ra.sweep = c.sweep AND ra.arm = c.arm_a
LEFT JOIN runs rb ON rb.sweep = c.sweep AND rb.arm = c.arm_b
GROUP BY c.sweep, c.arm_a, c.arm_b
ORDER BY c.sweep, c.arm_a, c.arm_b
