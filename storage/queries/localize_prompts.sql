-- One row per (arm pair, prompt) of the localize kind: where all-A and all-B first part (NULL:
-- identical through max_new_tokens), the tokens and top-1/top-2 margins there, the first differing
-- linear and decoder layer (output hashes, teacher-forced), the culprit set, the search's
-- generations, the verification flags and the replay artifact (a path relative to the results root).
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep, experiment, pair, arm_a, arm_b, kernel_a, kernel_b, prompt_index, max_new_tokens,
    first_divergence, token_a, token_b, margin_a, margin_b,
    first_diff_linear, first_diff_layer, linears_differing, linears_hashed, tf_reproduces,
    culprit, culprit_size, bisection_generations, culprit_divergence,
    verified_culprit_diverges, verified_none_identical, verified_one_minimal,
    artifact, artifact_sha256, artifact_reproduces, error
FROM localize
WHERE $sweep IS NULL OR sweep = $sweep
ORDER BY sweep, experiment, pair, prompt_index
