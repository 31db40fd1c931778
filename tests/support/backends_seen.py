"""What the run used of each database backend, for the summary line the root conftest prints.

Tests parametrised by ``backend`` count one test each; a deployment (a running Airflow or
Dagster kept on PostgreSQL) counts once per deployment started, and a throwaway server (the fault
suite's own PostgreSQL, standby, MariaDB or Galera node, started and stopped by the test) once per
server, so a run of only the deployment or fault tests still says which servers it used.
"""

from __future__ import annotations

from collections import Counter

#: Tests run per backend (``sqlite``, ``postgres``, ``mysql``).
TESTS: Counter[str] = Counter()
#: Deployments (Airflow, Dagster) started on a backend.
DEPLOYMENTS: Counter[str] = Counter()
#: Throwaway servers a test started itself (never the shared ones), per backend.
THROWAWAY: Counter[str] = Counter()


def summary(backends: tuple[str, ...]) -> str:
    """``sqlite (12 tests), postgres (10 tests, 2 deployments, 3 throwaway servers)``, or ``none``."""
    parts = []
    for name in backends:
        counts = [f"{n} {what}" for n, what in ((TESTS[name], "tests"), (DEPLOYMENTS[name], "deployments"),
                                                 (THROWAWAY[name], "throwaway servers")) if n]
        if counts:
            parts.append(f"{name} ({', '.join(counts)})")
    return ", ".join(parts) or "none"


def export() -> dict[str, dict[str, int]]:
    """The counts as plain data, for a pytest-xdist worker to send to the controller."""
    return {"tests": dict(TESTS), "deployments": dict(DEPLOYMENTS), "throwaway": dict(THROWAWAY)}


def merge(counts: dict[str, dict[str, int]]) -> None:
    """Add a worker's :func:`export` to this process's counts (the controller prints the summary)."""
    for counter, key in ((TESTS, "tests"), (DEPLOYMENTS, "deployments"), (THROWAWAY, "throwaway")):
        counter.update(counts.get(key, {}))


def used(name: str) -> bool:
    return bool(TESTS[name] or DEPLOYMENTS[name] or THROWAWAY[name])
