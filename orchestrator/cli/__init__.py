"""The ``swapcheck`` command line: thin typer commands over the library, one module per group."""
