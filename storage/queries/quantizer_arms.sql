-- Activation quantizer of each generate arm, for quantizer-swap certificates: per (sweep, arm), the
-- engine, the configured GEMM kernel, the quantizer's registry name, its parameters (JSON text,
-- sorted keys) and version, all from arm_runs.kernel_calls_json (`evidence.quantizer`, written by
-- the generate kind when the arm names a quantizer). quantizer is NULL for an arm without one
-- (the engine's own). Several distinct values across restarts are joined with ','.
-- Parameters: $sweep (NULL for every sweep).
SELECT
    sweep,
    arm,
    string_agg(DISTINCT engine, ',' ORDER BY engine)                                  AS engine,
    string_agg(DISTINCT configured_kernel, ',' ORDER BY configured_kernel)            AS kernel,
    string_agg(DISTINCT json_extract_string(kernel_calls_json, '$.evidence.quantizer.quantizer'), ',')
                                                                                      AS quantizer,
    string_agg(DISTINCT json_extract(kernel_calls_json, '$.evidence.quantizer.params')::VARCHAR, ',')
                                                                                      AS quantizer_params,
    string_agg(DISTINCT json_extract_string(kernel_calls_json, '$.evidence.quantizer.version'), ',')
                                                                                      AS quantizer_version
FROM arm_runs
WHERE $sweep IS NULL OR sweep = $sweep
GROUP BY sweep, arm
ORDER BY sweep, arm
