-- The three-way arbiter's evidence (issue #41; reports/arbiter.py, docs/certificate.md "The arbiter"):
-- one row per (sweep, kernel pair, scale mode, side), each side of the pair judged against the bound
-- of the accumulation algorithm its kernel declares, around the exact result, over the K-depth units
-- where the pair was compared (the side's `comparison = 'reference'` rows of those units); pair_a is
-- the pair's name that sorts first.
--
--   units / units_judged / units_unrecorded   the side's units; those judged (bound_status 'judged');
--                            those written before kdepth recorded bounds (bound_status NULL)
--   statuses                 the distinct bound_status values: 'judged', 'no bound declared',
--                            'bias not modelled'
--   algorithms               the declared algorithms, 'name (format)', comma-separated
--   elements_judged          outputs of the judged units
--   outside_bound            outputs outside the bound (judged units)
--   max_bound_ratio          the largest |out - exact| beyond the output's own rounding, in units of
--                            the bound (<= 1 inside; tasks/checks/scaled_bound.py)
--   worst                    where it is: {k, seed, row, col}
--   max_spacing*, differing  the side's existing distance from the reference, in output spacings
-- Parameters: $sweep (NULL for every sweep).
WITH pairs AS (
    SELECT DISTINCT sweep, unit_id, least(impl_a, impl_b) AS pair_a, greatest(impl_a, impl_b) AS pair_b
    FROM kdepth
    WHERE comparison = 'pair' AND ($sweep IS NULL OR sweep = $sweep)
), refs AS (
    SELECT *
    FROM kdepth
    WHERE comparison = 'reference' AND ($sweep IS NULL OR sweep = $sweep)
)
SELECT
    p.sweep,
    p.pair_a,
    p.pair_b,
    r.scale_mode,
    r.impl_a                                                             AS side,
    any_value(r.kernel_a)                                                AS kernel,
    any_value(r.impl_b)                                                  AS reference,
    any_value(r.kernel_b)                                                AS reference_kernel,
    any_value(r.out_dtype)                                               AS out_dtype,
    count(*)::BIGINT                                                     AS units,
    count(*) FILTER (WHERE r.bound_status = 'judged')::BIGINT            AS units_judged,
    count(*) FILTER (WHERE r.bound_status IS NULL)::BIGINT               AS units_unrecorded,
    list_sort(list_distinct(list(r.bound_status)))                       AS statuses,
    string_agg(DISTINCT r.bound_algorithm || ' (' || r.bound_accumulate || ')', ', ')
                                                                         AS algorithms,
    sum(r.elements) FILTER (WHERE r.bound_status = 'judged')::BIGINT     AS elements_judged,
    sum(r.outside_bound)::BIGINT                                         AS outside_bound,
    max(r.max_bound_ratio)                                               AS max_bound_ratio,
    arg_max({'k': r.k, 'seed': r.seed, 'row': r.bound_worst_row, 'col': r.bound_worst_col},
            r.max_bound_ratio)                                           AS worst,
    sum(r.differing)::BIGINT                                             AS differing,
    sum(r.elements)::BIGINT                                              AS elements,
    max(r.max_spacing)::BIGINT                                           AS max_spacing,
    max(r.max_spacing_significant)::BIGINT                               AS max_spacing_significant
FROM pairs p
JOIN refs r ON r.sweep = p.sweep AND r.unit_id = p.unit_id AND r.impl_a IN (p.pair_a, p.pair_b)
GROUP BY p.sweep, p.pair_a, p.pair_b, r.scale_mode, r.impl_a
ORDER BY p.sweep, p.pair_a, p.pair_b, r.scale_mode, r.impl_a
