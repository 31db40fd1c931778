"""Shared test support: event tables, worker processes and their helpers, imported by name (``support.*``).

``tests/`` is on ``sys.path`` for every test (pytest inserts the root conftest's directory), so
test modules import these as ordinary modules instead of loading files by path.
"""
