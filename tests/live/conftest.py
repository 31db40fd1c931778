"""Tests that run several orchestrators' deployments at once: their harnesses are importable here.

The Airflow, Dagster and Prefect deployment harnesses live beside their own tests
(``tests/airflow/live_airflow.py``, ``tests/dagster/ct_dagster_live/``, ``tests/prefect/live_prefect.py``);
a test that starts all three imports them from there rather than keep a second copy. Only the
harness modules are imported: the plugins' own conftests (an Airflow home, a DAGSTER_HOME per test)
are not loaded, and this process never imports Airflow or Prefect (each deployment runs its own).
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for _folder in ("airflow", "dagster", "prefect"):
    if str(_TESTS / _folder) not in sys.path:
        sys.path.append(str(_TESTS / _folder))
