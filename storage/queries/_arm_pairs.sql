-- Arm pairs: the one rule of every query that compares two arms' restart-0 sequences (included where
-- a query writes "-- include: _arm_pairs" after a CTE named src with sweep, experiment, arm and
-- prompt_index): arms; pairs (arm_a < arm_b) of two arms of ONE experiment -- an arm of another
-- experiment runs another model or other prompts, and pairing it would report that as a kernel swap's
-- (tests/test_pairs_within_experiment.py); and the prompts of each experiment.
arms AS (
    SELECT DISTINCT sweep, experiment, arm FROM src
),
pairs AS (
    SELECT a.sweep, a.experiment, a.arm AS arm_a, b.arm AS arm_b
    FROM arms a
    JOIN arms b ON a.sweep = b.sweep AND a.experiment = b.experiment AND a.arm < b.arm
),
prompts AS (
    SELECT DISTINCT sweep, experiment, prompt_index FROM src
)
