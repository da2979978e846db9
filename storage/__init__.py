"""The results tree (``storage.store``) and its read-only DuckDB catalog (``storage.catalog``).

Layer rule: ``storage`` imports nothing else of swapcheck (no orchestrator, tasks or reports).
"""
