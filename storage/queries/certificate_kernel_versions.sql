-- Kernel versions a sweep ran: per sweep, the distinct (kernel, version) of every implementation
-- named in a unit's parameters (kdepth implementations and reference, replay pairs, check kernels,
-- generate/teacher_forced arms, attention kernels of attention_replay pairs and arms). The version is the kernel's declared VERSION (it joins the unit id).
-- Parameters: $sweep (NULL for every sweep).
WITH u AS (
    SELECT sweep, kind, params_json FROM units WHERE $sweep IS NULL OR sweep = $sweep
),
named AS (
    SELECT sweep, unnest(json_extract(params_json, '$.implementations[*]')) AS impl FROM u WHERE kind = 'kdepth'
    UNION ALL
    SELECT sweep, json_extract(params_json, '$.reference') FROM u WHERE kind = 'kdepth'
    UNION ALL
    SELECT sweep, unnest(json_extract(params_json, '$.pairs[*][*]')) FROM u WHERE kind = 'replay'
    UNION ALL
    SELECT sweep, json_extract(params_json, '$.arm') FROM u WHERE kind IN ('generate', 'teacher_forced')
    UNION ALL
    SELECT sweep, params_json::JSON FROM u WHERE kind IN ('exact_match', 'bounds')
    UNION ALL  -- attention kernels ({name, version}): of attention_replay pairs and of arms that name one
    SELECT sweep, json_object('kernel', json_extract_string(a, '$.name'), 'version', json_extract_string(a, '$.version'))
    FROM (SELECT sweep, unnest(json_extract(params_json, '$.pairs[*][*]')) AS a FROM u WHERE kind = 'attention_replay'
          UNION ALL
          SELECT sweep, json_extract(params_json, '$.arm.attention') FROM u
          WHERE kind IN ('generate', 'teacher_forced') AND json_extract(params_json, '$.arm.attention') IS NOT NULL)
)
SELECT DISTINCT
    sweep,
    json_extract_string(impl, '$.kernel')  AS kernel,
    json_extract_string(impl, '$.version') AS version
FROM named
WHERE json_extract_string(impl, '$.kernel') IS NOT NULL
ORDER BY sweep, kernel, version
