-- A counterexample of a refuted `every` prediction: the smallest {{label}} of the sweep's rows of
-- {{table}} matching {{where}} that do not satisfy {{every}}.
-- Filled by reports.predictions.run_prediction (see prediction_every.sql). Parameters: $sweep.
SELECT ({{label}}) AS label
FROM {{table}}
WHERE sweep = $sweep AND ({{where}}) AND NOT coalesce(({{every}}), false)
ORDER BY 1
LIMIT 1
