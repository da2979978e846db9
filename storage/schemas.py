"""Arrow schemas of every results table (documented column by column in docs/schema.md).

Files live at ``<results>/table=<table>/sweep=<sweep>/<name>.parquet``; ``table`` and ``sweep`` are
hive partition columns that DuckDB adds, so they are not stored inside the files.
"""

from __future__ import annotations

import pyarrow as pa

_COMPARE = [
    ("elements", pa.int64()),
    ("differing", pa.int64()),
    ("frac_differing", pa.float64()),
    ("max_spacing", pa.int64()),
    ("max_spacing_significant", pa.int64()),
    ("hist_0", pa.int64()),
    ("hist_1", pa.int64()),
    ("hist_2", pa.int64()),
    ("hist_gt2", pa.int64()),
    ("nonfinite_mismatch", pa.int64()),
    ("max_abs_error", pa.float64()),
    ("worst_row", pa.int32()),
    ("worst_col", pa.int32()),
    ("worst_a", pa.float64()),
    ("worst_b", pa.float64()),
]

KDEPTH = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("dtype", pa.string()),
        ("out_dtype", pa.string()),
        ("m", pa.int32()),
        ("n", pa.int32()),
        ("k", pa.int32()),
        ("seed", pa.int32()),
        ("scale_mode", pa.string()),
        ("bias", pa.bool_()),
        ("comparison", pa.string()),
        ("impl_a", pa.string()),
        ("impl_b", pa.string()),
        ("kernel_a", pa.string()),
        ("kernel_b", pa.string()),
        *_COMPARE,
        ("seconds_a", pa.float64()),
        ("seconds_b", pa.float64()),
        # issue #41 (NULL in pair rows and in older files): on a reference row, impl_a judged against
        # the bound of the accumulation algorithm its kernel declares, around the exact result
        # (tasks/checks/scaled_bound.py): bound_status "judged", "no bound declared" or "bias not
        # modelled"; the algorithm and its format; elements outside; the largest |out - exact| in
        # units of the bound (<= 1 inside) and the element it is at
        ("bound_status", pa.string()),
        ("bound_algorithm", pa.string()),
        ("bound_accumulate", pa.string()),
        ("outside_bound", pa.int64()),
        ("max_bound_ratio", pa.float64()),
        ("bound_worst_row", pa.int32()),
        ("bound_worst_col", pa.int32()),
    ]
)


REPLAY = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("model", pa.string()),
        ("layer", pa.string()),
        ("layer_index", pa.int32()),
        ("layer_type", pa.string()),
        ("scale_mode", pa.string()),
        ("comparison", pa.string()),
        ("impl_a", pa.string()),
        ("impl_b", pa.string()),
        ("m", pa.int32()),
        ("n", pa.int32()),
        ("k", pa.int32()),
        *_COMPARE,
        ("bitwise_equal", pa.bool_()),
        ("accumulators_equal", pa.bool_()),
        ("accumulators_exact", pa.bool_()),
        ("accumulator_check", pa.string()),
        ("max_abs_accumulator", pa.int64()),
    ]
)

CAPTURES = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("model", pa.string()),
        ("layer", pa.string()),
        ("layer_index", pa.int32()),
        ("layer_type", pa.string()),
        ("m", pa.int32()),
        ("n", pa.int32()),
        ("k", pa.int32()),
        ("x_dtype", pa.string()),
        ("out_dtype", pa.string()),
        ("x_scale_layout", pa.string()),
        ("w_scale_layout", pa.string()),
        ("has_bias", pa.bool_()),
        ("capture_kernel", pa.string()),
        ("kernel_calls", pa.int64()),
        ("file", pa.string()),
    ]
)

GENERATIONS = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("arm", pa.string()),
        ("restart", pa.int32()),
        ("prompt_index", pa.int32()),
        ("position", pa.int32()),
        ("token", pa.int64()),
        ("margin", pa.float64()),
        ("topk_ids", pa.list_(pa.int64())),
        ("topk_logits", pa.list_(pa.float64())),
        # vLLM arms, restart 0: the generated token's log-probability (float64, natural log) under the
        # arm's own teacher-forced pass over its sequence, in its own process: the reference side of
        # teacher_forced's probability columns on vLLM. NULL on the CPU engine (its teacher_forced unit
        # computes both sides itself), on other restarts and in older results (docs/schema.md).
        ("teacher_forced_token_logprob", pa.float64()),
    ]
)

SEQUENCES = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("arm", pa.string()),
        ("restart", pa.int32()),
        ("prompt_index", pa.int32()),
        ("prompt_hash", pa.string()),
        ("sequence_hash", pa.string()),
        ("n_tokens", pa.int32()),
        ("tokens", pa.list_(pa.int64())),
        # A prompt with an expected answer (a prompt file's "answer"): the first len(answer) generated
        # tokens, and whether they equal it. Null for prompts without one.
        ("extracted_answer", pa.list_(pa.int64())),
        ("correct", pa.bool_()),
    ]
)

ARM_RUNS = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("arm", pa.string()),
        ("restart", pa.int32()),
        ("model", pa.string()),
        ("engine", pa.string()),
        ("configured_kernel", pa.string()),
        ("scales", pa.string()),
        ("env_json", pa.string()),
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("observed_kernels", pa.list_(pa.string())),
        ("kernel_calls_json", pa.string()),
        ("evidence_ok", pa.bool_()),
        ("weights_sha256", pa.string()),
        ("attention", pa.string()),
    ]
)

TEACHER_FORCED = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("ref_arm", pa.string()),
        ("ref_restart", pa.int32()),
        ("arm", pa.string()),
        ("prompt_index", pa.int32()),
        ("position", pa.int32()),
        ("ref_token", pa.int64()),
        ("ref_argmax", pa.int64()),
        ("ref_margin", pa.float64()),
        ("arm_argmax", pa.int64()),
        ("arm_margin", pa.float64()),
        ("flip", pa.bool_()),
        # From each arm's full-vocabulary logits (NULL in older results): p of the reference token
        # under each arm, exact KL(ref || arm), k3 = r - 1 - log r with r = p_arm / p_ref of the
        # reference token (tasks/kinds/teacher_forced.py, docs/divergence.md). On vLLM each arm's side
        # comes from its own process (the reference's: generations.teacher_forced_token_logprob) and
        # the KL is NULL: the two full distributions are never in one process there.
        ("ref_token_prob_ref", pa.float64()),
        ("ref_token_prob_arm", pa.float64()),
        ("kl_ref_arm", pa.float64()),
        ("k3_ref_arm", pa.float64()),
    ]
)

def _check_schema(extra: list[tuple[str, pa.DataType]]) -> pa.Schema:
    """Rows of the exact_match / bounds checks (tasks.checks.result.ROW_COLUMNS, docs/checks.md)."""
    element = [("row", pa.int64()), ("col", pa.int64()), ("exact", pa.float64()), ("expected", pa.float64()),
               ("observed", pa.float64()), ("spacings", pa.int64()), ("low", pa.float64()), ("high", pa.float64())]
    return pa.schema(
        [
            ("unit_id", pa.string()),
            ("experiment", pa.string()),
            ("kernel", pa.string()),
            ("kind", pa.string()),
            ("operands", pa.string()),
            ("dtype", pa.string()),
            *extra,
            ("check", pa.string()),
            ("m", pa.int64()),
            ("k", pa.int64()),
            ("n", pa.int64()),
            ("trial", pa.int64()),
            ("seed", pa.int64()),
            ("verdict", pa.string()),
            ("positions", pa.int64()),
            ("checked", pa.int64()),
            ("mismatches", pa.int64()),
            ("differing", pa.int64()),
            ("max_spacing", pa.int64()),
            ("error", pa.string()),
            ("seconds", pa.float64()),
            ("p", pa.float64()),
            ("limit", pa.int64()),
            ("inputs", pa.string()),
            ("algorithm", pa.string()),
            ("output_dtype", pa.string()),
            ("scales", pa.string()),
            ("scale_a_numel", pa.int64()),
            ("scale_b_numel", pa.int64()),
            ("nan_mismatches", pa.int64()),
            ("problem", pa.string()),
            *[(f"first_{k}", t) for k, t in element],
            *[(f"worst_{k}", t) for k, t in element],
        ]
    )


EXACT_MATCH = _check_schema([])
BOUNDS = _check_schema([("accumulate", pa.string())])
#: ``precision``: one row per (family, draw) of the precision-downgrade probe (tasks.kinds.precision;
#: ``inputs`` is the family). Same columns as exact_match.
PRECISION = _check_schema([])

#: ``fuzz``: one row per fuzz trial of one kernel (tasks.kinds.fuzz; docs/schema.md). A failing trial
#: carries its shrunk shape, the failing element and the artifact that replays it; ``layout`` is the
#: operands' memory layout and ``classes`` the boundary classes the trial hit (issue 26; null in
#: files written before); ``exact_inputs`` exact match's input kind (fuzz version 3; null before).
FUZZ = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("kernel", pa.string()),
        ("kernel_version", pa.string()),
        ("kind", pa.string()),
        ("operands", pa.string()),
        ("dtype", pa.string()),
        ("algorithm", pa.string()),
        ("seed", pa.int64()),
        ("budget_s", pa.float64()),
        ("trial", pa.int64()),
        ("m", pa.int64()),
        ("k", pa.int64()),
        ("n", pa.int64()),
        ("recipe", pa.string()),
        ("scales", pa.string()),
        ("exact_match_verdict", pa.string()),
        ("bounds_verdict", pa.string()),
        ("verdict", pa.string()),
        ("seconds", pa.float64()),
        ("failed_check", pa.string()),
        ("shrunk_m", pa.int64()),
        ("shrunk_k", pa.int64()),
        ("shrunk_n", pa.int64()),
        ("shrink_runs", pa.int64()),
        ("first_row", pa.int64()),
        ("first_col", pa.int64()),
        ("first_expected", pa.float64()),
        ("first_observed", pa.float64()),
        ("error", pa.string()),
        ("artifact", pa.string()),
        ("layout", pa.string()),
        ("classes", pa.list_(pa.string())),
        ("exact_inputs", pa.string()),
    ]
)

#: ``batch_invariance`` kernel level: one row per (kernel, seed, M, probe position); docs/schema.md.
BATCH_INVARIANCE = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("kernel", pa.string()),
        ("kernel_name", pa.string()),
        ("kernel_version", pa.string()),
        ("device", pa.string()),
        ("dtype", pa.string()),
        ("out_dtype", pa.string()),
        ("scale_mode", pa.string()),
        ("k", pa.int32()),
        ("n", pa.int32()),
        ("seed", pa.int64()),
        ("tolerance_spacings", pa.int64()),
        ("m", pa.int32()),
        ("position", pa.string()),
        ("row_index", pa.int32()),
        *_COMPARE,
        ("bitwise_equal", pa.bool_()),
        ("seconds", pa.float64()),
        ("seconds_reference", pa.float64()),
        # issue #26 (NULL in older files): the declared algorithm and its format, the torch thread
        # count, each computation's elements outside the algorithm's bound, the largest
        # |batch - alone| / bound width, and the elements differing from the same cell at the unit's
        # first thread count (NULL at the first) with their largest distance in output spacings
        ("algorithm", pa.string()),
        ("accumulate", pa.string()),
        ("threads", pa.int32()),
        ("outside_bound", pa.int64()),
        ("reference_outside_bound", pa.int64()),
        ("max_bound_ratio", pa.float64()),
        ("thread_differing", pa.int64()),
        ("thread_max_spacing", pa.int64()),
    ]
)

#: ``batch_invariance`` model level: one row per (reductions, batch, comparison, prompt, position).
BATCH_INVARIANCE_MODEL = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("model", pa.string()),
        ("kernel", pa.string()),
        # the attention kernel of the experiment's `attention` (NULL: the one `reductions` picks)
        ("attention", pa.string()),
        ("scales", pa.string()),
        ("reductions", pa.string()),
        ("comparison", pa.string()),
        ("batch", pa.int32()),
        ("prompt_index", pa.int32()),
        ("slot", pa.int32()),
        ("padding", pa.int32()),
        ("width", pa.int32()),
        ("position", pa.int32()),
        ("ref_argmax", pa.int64()),
        ("argmax", pa.int64()),
        ("argmax_equal", pa.bool_()),
        ("logits_equal", pa.bool_()),
        ("vocab", pa.int64()),
        ("differing", pa.int64()),
        ("nonfinite_mismatch", pa.int64()),
        ("max_spacing", pa.int64()),
        ("max_spacing_significant", pa.int64()),
        ("argmax_spacing", pa.int64()),
        ("ref_margin", pa.float64()),
        ("margin", pa.float64()),
    ]
)

#: ``batch_invariance`` kernel level, attention kernels: one row per (kernel, seed, B, probe position).
BATCH_INVARIANCE_ATTENTION = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("kernel", pa.string()),
        ("kernel_version", pa.string()),
        ("device", pa.string()),
        ("dtype", pa.string()),
        ("heads", pa.int32()),
        ("seq_len", pa.int32()),
        ("head_dim", pa.int32()),
        ("causal", pa.bool_()),
        ("seed", pa.int64()),
        ("tolerance_spacings", pa.int64()),
        ("batch", pa.int32()),
        ("position", pa.string()),
        ("row_index", pa.int32()),
        *_COMPARE,
        ("lse_differing", pa.int64()),
        ("lse_max_spacing", pa.int64()),
        ("bitwise_equal", pa.bool_()),
        ("seconds", pa.float64()),
        ("seconds_reference", pa.float64()),
    ]
)

#: The ``quantize`` kind: one row per (layer call, reference quantizer, candidate quantizer)
#: (docs/schema.md, docs/quantizers.md). ``gemm_weights``: the weights the downstream GEMM multiplied
#: (the engine's int8, or FP8 e4m3 per channel for an FP8 pair; NULL in results written before FP8
#: pairs had a downstream, whose FP8 rows have NULL ``out_*``).
QUANTIZE = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("model", pa.string()),
        ("activation_dtype", pa.string()),
        ("layer", pa.string()),
        ("layer_index", pa.int32()),
        ("layer_type", pa.string()),
        ("m", pa.int64()),
        ("k", pa.int64()),
        ("n", pa.int64()),
        ("reference", pa.string()),
        ("reference_quantizer", pa.string()),
        ("candidate", pa.string()),
        ("candidate_quantizer", pa.string()),
        ("reference_params", pa.string()),
        ("candidate_params", pa.string()),
        ("gemm_kernel", pa.string()),
        ("gemm_weights", pa.string()),
        ("q_dtype", pa.string()),
        ("elements", pa.int64()),
        ("q_differing", pa.int64()),
        ("q_frac_differing", pa.float64()),
        ("q_max_abs_diff", pa.float64()),
        ("q_max_spacing", pa.int64()),
        ("tokens", pa.int64()),
        ("scales_differing", pa.int64()),
        ("scale_format", pa.string()),
        ("scale_max_spacing", pa.int64()),
        ("scale_max_rel_diff", pa.float64()),
        ("out_elements", pa.int64()),
        ("out_differing", pa.int64()),
        ("out_frac_differing", pa.float64()),
        ("out_max_spacing", pa.int64()),
        ("out_max_spacing_significant", pa.int64()),
        ("out_max_abs_error", pa.float64()),
        ("out_bitwise_equal", pa.bool_()),
    ]
)

PREREGISTRATIONS = pa.schema(
    [
        ("path", pa.string()),
        ("sha256", pa.string()),
        ("amends", pa.string()),
        ("registered_at", pa.timestamp("us", tz="UTC")),
        ("results_existed", pa.bool_()),
        ("text", pa.string()),
    ]
)

#: One committed result file of a unit: ``path`` relative to the results root
#: (``table=<t>/sweep=<s>/<unit_id>.parquet``), its row count, size and SHA-256 of its bytes.
FILE_RECORD = pa.struct([("table", pa.string()), ("path", pa.string()), ("rows", pa.int64()),
                         ("bytes", pa.int64()), ("sha256", pa.string())])

UNITS = pa.schema(
    [
        ("unit_id", pa.string()),
        ("kind", pa.string()),
        ("experiment", pa.string()),
        ("description", pa.string()),
        ("params_json", pa.string()),
        ("status", pa.string()),
        ("attempts", pa.int32()),
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("node_id", pa.string()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("duration_s", pa.float64()),
        ("error", pa.string()),
        ("tables", pa.list_(pa.string())),
        ("rows", pa.int64()),
        ("spec_sha256", pa.string()),
        ("swapcheck_version", pa.string()),
        ("torch_version", pa.string()),
        # The unit's committed result files: what `swapcheck sweep verify` checks and what the catalog
        # reads. NULL in ledger rows written before integrity records existed.
        ("files", pa.list_(FILE_RECORD)),
    ]
)

#: The Parquet key-value metadata key under which each result file a unit commits carries that unit's
#: ledger row (JSON: ``{"sweep": ..., "row": {every UNITS column}}`` with ``files`` as table, path and
#: rows of every file of the unit: a file cannot hold its own size or hash). ``sweep verify``
#: cross-checks ledger rows against it both ways, and ``launch --repair`` rebuilds a lost or damaged
#: ledger file from it (``storage.store.ResultStore.commit_unit``, ``storage.verify``).
LEDGER_ROW_KEY = "swapcheck.ledger_row"

SWEEPS = pa.schema(
    [
        ("spec_sha256", pa.string()),
        ("question", pa.string()),
        ("spec_path", pa.string()),
        ("spec_toml", pa.string()),
        ("n_units", pa.int64()),
        ("unit_ids", pa.list_(pa.string())),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ]
)

LAUNCHES = pa.schema(
    [
        ("launch_id", pa.string()),
        ("spec_sha256", pa.string()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("address", pa.string()),
        ("embedded", pa.bool_()),
        ("n_units", pa.int64()),
        ("n_skipped", pa.int64()),
        ("n_ok", pa.int64()),
        ("n_failed", pa.int64()),
        ("status", pa.string()),
        ("provenance_json", pa.string()),
    ]
)

ATTENTION_REPLAY = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("model", pa.string()),
        ("layer", pa.string()),
        ("layer_index", pa.int32()),
        ("dtype", pa.string()),
        ("comparison", pa.string()),
        ("impl_a", pa.string()),
        ("impl_b", pa.string()),
        ("batch", pa.int32()),
        ("heads", pa.int32()),
        ("kv_heads", pa.int32()),
        ("q_len", pa.int32()),
        ("kv_len", pa.int32()),
        ("head_dim", pa.int32()),
        ("masked", pa.bool_()),
        *_COMPARE,
        ("bitwise_equal", pa.bool_()),
        ("lse_elements", pa.int64()),
        ("lse_differing", pa.int64()),
        ("lse_max_spacing", pa.int64()),
        ("lse_max_abs_error", pa.float64()),
        ("seconds_a", pa.float64()),
        ("seconds_b", pa.float64()),
        ("algorithm", pa.string()),
        ("outside_bound", pa.int64()),
        ("lse_outside_bound", pa.int64()),
        # The kernels were called with is_causal=True in place of the layer's exactly causal mask (false:
        # with the mask). NULL in files written before the kind took CUDA kernels (every call had the mask).
        ("is_causal", pa.bool_()),
    ]
)

#: ``localize``: one row per (arm pair, prompt) of the localize kind (tasks.kinds.localize; issue 27;
#: docs/localize.md): the first generated position where all-A and all-B part (null: never), the
#: first linear / decoder layer whose output hash differs teacher-forced, the 1-minimal culprit set
#: found by ddmin with its verification flags, and the culprit replay artifact.
LOCALIZE = pa.schema(
    [
        ("unit_id", pa.string()),
        ("experiment", pa.string()),
        ("model", pa.string()),
        ("pair", pa.string()),
        ("arm_a", pa.string()),
        ("arm_b", pa.string()),
        ("kernel_a", pa.string()),
        ("kernel_b", pa.string()),
        ("scales", pa.string()),
        ("prompt_index", pa.int32()),
        ("prompt_tokens", pa.int32()),
        ("max_new_tokens", pa.int32()),
        ("generated", pa.int32()),
        ("first_divergence", pa.int32()),
        ("token_a", pa.int64()),
        ("token_b", pa.int64()),
        ("margin_a", pa.float64()),
        ("margin_b", pa.float64()),
        ("first_diff_linear", pa.string()),
        ("first_diff_linear_order", pa.int32()),
        ("first_diff_layer", pa.int32()),
        ("linears_differing", pa.int32()),
        ("linears_hashed", pa.int32()),
        ("tf_reproduces", pa.bool_()),
        ("culprit", pa.list_(pa.string())),
        ("culprit_size", pa.int32()),
        ("bisection_generations", pa.int32()),
        ("bisection_tests", pa.int32()),
        ("culprit_divergence", pa.int32()),
        ("verified_culprit_diverges", pa.bool_()),
        ("verified_none_identical", pa.bool_()),
        ("verified_one_minimal", pa.bool_()),
        ("verification_generations", pa.int32()),
        ("artifact", pa.string()),
        ("artifact_sha256", pa.string()),
        ("artifact_reproduces", pa.bool_()),
        ("error", pa.string()),
    ]
)

#: Tables whose files are no unit's results (no ledger row names them): the catalog reads them whole
#: (minus damage) and ``sweep verify`` does not hold them to the ledger. Defined once, here.
UNMANAGED_TABLES = frozenset({"units", "sweeps", "launches", "preregistrations"})

TABLES: dict[str, pa.Schema] = {
    "kdepth": KDEPTH,
    "replay": REPLAY,
    "captures": CAPTURES,
    "preregistrations": PREREGISTRATIONS,
    "generations": GENERATIONS,
    "sequences": SEQUENCES,
    "arm_runs": ARM_RUNS,
    "attention_replay": ATTENTION_REPLAY,
    "teacher_forced": TEACHER_FORCED,
    "exact_match": EXACT_MATCH,
    "bounds": BOUNDS,
    "precision": PRECISION,
    "fuzz": FUZZ,
    "batch_invariance": BATCH_INVARIANCE,
    "batch_invariance_model": BATCH_INVARIANCE_MODEL,
    "batch_invariance_attention": BATCH_INVARIANCE_ATTENTION,
    "quantize": QUANTIZE,
    "localize": LOCALIZE,
    "units": UNITS,
    "sweeps": SWEEPS,
    "launches": LAUNCHES,
}


def fingerprint() -> str:
    """A SHA-256 (hex) of every declared table schema: what a cache of checks against them, or a
    generated tree written under them, depends on."""
    import hashlib

    return hashlib.sha256(
        "\n".join(f"{t}:{TABLES[t].remove_metadata()}" for t in sorted(TABLES)).encode()).hexdigest()


def register_table(name: str, schema: pa.Schema) -> pa.Schema:
    """Declare another results table (a plugin kind's); the same name twice must be the same schema.

    Built-in tables are declared above; a kind defined outside this package registers its tables
    when its module is imported, so the worker that runs it and the catalog that reads it agree.
    """
    if not isinstance(schema, pa.Schema) or "unit_id" not in schema.names:
        raise ValueError(f"table {name!r}: a result table is a pyarrow Schema with a unit_id column")
    known = TABLES.get(name)
    if known is not None and not known.equals(schema):
        raise ValueError(f"table {name!r} is already declared with another schema")
    TABLES[name] = schema
    return schema
