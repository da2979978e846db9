"""One module per report, each defining ``REPORT`` (a :class:`reports.registry.Report`).

A module here is found by ``reports.registry.report_registry`` without any list to edit; its file name
(``_`` read as ``-``) is the report's name. Modules stay light at import: the logic they call is
imported inside ``build``, so ``swapcheck --help`` imports no DuckDB, numpy or matplotlib.
"""
