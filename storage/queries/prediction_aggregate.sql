-- A pre-registered `aggregate` prediction: whether {{aggregate}} holds over all the sweep's rows of
-- {{table}} matching {{where}} (NULL counts as failing), with the optional {{measure}} (NULL when the
-- prediction has none).
-- Filled by reports.predictions.run_prediction (see prediction_every.sql). Parameters: $sweep.
SELECT
    count(*)                            AS n,
    coalesce(({{aggregate}}), false)    AS ok,
    ({{measure}})                       AS measured
FROM {{table}}
WHERE sweep = $sweep AND ({{where}})
