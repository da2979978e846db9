"""The reports: every table, figure and metric swapcheck shows, computed over one ``Catalog``.

Layer rule: ``reports`` imports only ``storage`` (and third-party libraries), never ``orchestrator``
or ``tasks``. Every function takes a :class:`storage.catalog.Catalog` (one read-only DuckDB
connection per command) and every number comes from ONE named query in ``storage/queries/*.sql``
with bound ``$params``; the only composed SQL is the user-written fragments of pre-registered
predictions (``reports.predictions.run_prediction``).

Modules: ``kdepth``, ``replay``, ``agreement`` (table shaping per experiment), ``conformance`` (one
line per kernel pair, check verdicts), ``fliprisk`` (the flip-risk model) and ``flips`` (its
tables), ``predictions`` (scoring pre-registered predictions), ``metrics`` (nightly summary metrics
and their comparison) and ``render`` (the one Markdown/HTML renderer).
"""
