"""What every layer of swapcheck shares: the one registry shape and the one base of input errors.

``swapcheck_common`` imports nothing of swapcheck (checked by import-linter, pyproject.toml), so ``tasks``,
``storage``, ``reports`` and ``orchestrator`` may all build on it without bending the layers.
"""
