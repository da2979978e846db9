-- Shared by first_divergence and position_agreement (included where they write
-- "-- include: _generation_pairs"): the CTEs src (the restart-0 generations), arms, pairs and prompts
-- (_arm_pairs.sql: two arms of one experiment), partial and cmp. cmp holds one row per sweep, arm
-- pair, prompt and generated position that either arm generated, with
-- both arms' restart-0 token and margin there and whether the tokens differ (a position one arm did
-- not generate differs). Parameters: $sweep (NULL for every sweep).
-- Method: restart-0 positions of the two arms are paired by a self-join on (sweep, experiment,
-- prompt_index, position); only keys that some arm of the experiment did not generate go through
-- the pairs x keys grid.
src AS (
    SELECT sweep, experiment, arm, prompt_index, position, token, margin
    FROM generations
    WHERE restart = 0 AND ($sweep IS NULL OR sweep = $sweep)
),
-- include: _arm_pairs
,
partial AS (
    SELECT k.sweep, k.experiment, k.prompt_index, k.position
    FROM (SELECT sweep, experiment, prompt_index, position, count(DISTINCT arm) AS n
          FROM src GROUP BY sweep, experiment, prompt_index, position) k
    JOIN (SELECT sweep, experiment, count(*) AS n FROM arms GROUP BY sweep, experiment) a USING (sweep, experiment)
    WHERE k.n < a.n
),
cmp AS (
    SELECT
        x.sweep, x.arm AS arm_a, y.arm AS arm_b, x.prompt_index, x.position,
        x.token AS token_a, y.token AS token_b, x.margin AS margin_a, y.margin AS margin_b,
        x.token IS DISTINCT FROM y.token AS differs
    FROM src x
    JOIN src y ON x.sweep = y.sweep AND x.experiment = y.experiment AND x.prompt_index = y.prompt_index
        AND x.position = y.position AND x.arm < y.arm
    UNION ALL
    SELECT
        p.sweep, p.arm_a, p.arm_b, q.prompt_index, q.position,
        x.token, y.token, x.margin, y.margin, true
    FROM pairs p
    JOIN partial q ON q.sweep = p.sweep AND q.experiment = p.experiment
    LEFT JOIN src x ON x.sweep = p.sweep AND x.experiment = p.experiment AND x.arm = p.arm_a
        AND x.prompt_index = q.prompt_index AND x.position = q.position
    LEFT JOIN src y ON y.sweep = p.sweep AND y.experiment = p.experiment AND y.arm = p.arm_b
        AND y.prompt_index = q.prompt_index AND y.position = q.position
    WHERE (x.arm IS NULL) <> (y.arm IS NULL)
)
