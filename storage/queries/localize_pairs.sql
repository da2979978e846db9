-- The localize kind per (sweep, experiment, arm pair): prompts localized, prompts whose greedy
-- generations under all-A and all-B part within max_new_tokens, the first-divergence positions
-- (0-based generated-token index: min, median, max and the sorted list), the culprit-set sizes, the
-- verification counts (with the culprit set on B the generation diverges; with none swapped it
-- reproduces all-A; removing any one linear of the set no longer diverges), the units where the
-- first linear whose output hash differs is itself in the culprit set, replay artifacts that
-- reproduced byte for byte, the generations the searches ran, and units that ended in an error.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep, experiment, pair, any_value(arm_a) AS arm_a, any_value(arm_b) AS arm_b,
    any_value(kernel_a) AS kernel_a, any_value(kernel_b) AS kernel_b, any_value(scales) AS scales,
    any_value(max_new_tokens) AS max_new_tokens,
    count(*)                                                                   AS prompts,
    count(*) FILTER (WHERE first_divergence IS NOT NULL)                       AS diverged,
    min(first_divergence)                                                      AS first_divergence_min,
    median(first_divergence)                                                   AS first_divergence_median,
    max(first_divergence)                                                      AS first_divergence_max,
    list(first_divergence ORDER BY first_divergence) FILTER (WHERE first_divergence IS NOT NULL)
                                                                               AS first_divergences,
    list(culprit_size ORDER BY culprit_size) FILTER (WHERE culprit_size IS NOT NULL) AS culprit_sizes,
    count(*) FILTER (WHERE verified_culprit_diverges)                          AS culprit_diverges,
    count(*) FILTER (WHERE verified_none_identical)                            AS none_identical,
    count(*) FILTER (WHERE verified_one_minimal)                               AS one_minimal,
    count(*) FILTER (WHERE list_contains(culprit, first_diff_linear))          AS first_diff_in_culprit,
    count(*) FILTER (WHERE tf_reproduces)                                      AS tf_reproduces,
    count(*) FILTER (WHERE artifact_reproduces)                                AS artifacts_reproduced,
    count(*) FILTER (WHERE artifact_sha256 IS NOT NULL)                        AS artifacts,
    sum(bisection_generations)                                                 AS bisection_generations,
    median(bisection_generations)                                              AS bisection_generations_median,
    count(*) FILTER (WHERE error IS NOT NULL)                                  AS errors
FROM localize
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, experiment, pair
ORDER BY sweep, experiment, pair
