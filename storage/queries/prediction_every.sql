-- A pre-registered `every` prediction: of the sweep's rows of {{table}} matching {{where}}, how many
-- satisfy {{every}} (n matched, k satisfying; a NULL condition counts as failing).
-- {{table}}, {{where}} and {{every}} are filled from the prediction file by
-- reports.predictions.run_prediction (the one place user SQL text is composed; the table is checked
-- against storage.schemas.TABLES) and the statement runs read-only. Parameters: $sweep.
SELECT
    count(*)                                                  AS n,
    count(*) FILTER (WHERE coalesce(({{every}}), false))      AS k
FROM {{table}}
WHERE sweep = $sweep AND ({{where}})
