-- Spacing distances with their yardstick, shared by every query that reports distances of a
-- comparison table (tasks/comparison.py columns); included last in a grouped SELECT list where a
-- query writes "-- include: _near_zero_totals". S = max(max_spacing_significant), the normal-range
-- max of the group (outputs with |reference| >= 5% of their unit's largest |reference|).
-- near_zero_beyond: outputs of the group more than S spacings apart -- all near zero, since no
-- normal-range output is -- counted from the spacing histogram: exact when S <= 2 (or when the raw
-- max is <= S: none), else 1, a lower bound (near_zero_beyond_exact false). near_zero_max_spacing:
-- their largest distance (the raw max when it exceeds S; NULL: none). near_zero_worst_abs_error:
-- |a - b| at that farthest near-zero output (NULL: none); max_abs_error, over all outputs, is its
-- yardstick. reports/spacing.py sums groups by the same rule; docs/schema.md, "Spacing distances".
(CASE WHEN max(max_spacing) <= max(max_spacing_significant) THEN 0
      WHEN max(max_spacing_significant) = 0 THEN sum(hist_1 + hist_2 + hist_gt2)
      WHEN max(max_spacing_significant) = 1 THEN sum(hist_2 + hist_gt2)
      WHEN max(max_spacing_significant) = 2 THEN sum(hist_gt2)
      ELSE 1 END)::BIGINT                                                  AS near_zero_beyond,
max(max_spacing) <= max(max_spacing_significant) OR max(max_spacing_significant) <= 2
                                                                           AS near_zero_beyond_exact,
(CASE WHEN max(max_spacing) > max(max_spacing_significant)
      THEN max(max_spacing) END)::BIGINT                                   AS near_zero_max_spacing,
CASE WHEN max(max_spacing) > max(max_spacing_significant)
     THEN arg_max(abs(worst_a - worst_b), [max_spacing::DOUBLE, abs(worst_a - worst_b)]) END
                                                                           AS near_zero_worst_abs_error
