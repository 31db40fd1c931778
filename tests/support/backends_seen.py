"""What the run used of each database backend, for the summary line the root conftest prints.

Tests parametrised by ``backend`` count one test each; a deployment (a running Airflow or
Dagster kept on PostgreSQL) counts once per deployment started, so a run of only the deployment
tests still says which server it used.
"""

from __future__ import annotations

from collections import Counter

#: Tests run per backend (``sqlite``, ``postgres``, ``mysql``).
TESTS: Counter[str] = Counter()
#: Deployments (Airflow, Dagster) started on a backend.
DEPLOYMENTS: Counter[str] = Counter()


def summary(backends: tuple[str, ...]) -> str:
    """``sqlite (12 tests), postgres (10 tests, 2 deployments)``, or ``none``."""
    parts = []
    for name in backends:
        counts = [f"{n} {what}" for n, what in ((TESTS[name], "tests"), (DEPLOYMENTS[name], "deployments")) if n]
        if counts:
            parts.append(f"{name} ({', '.join(counts)})")
    return ", ".join(parts) or "none"


def used(name: str) -> bool:
    return bool(TESTS[name] or DEPLOYMENTS[name])
