"""Failure translation: a controltable error becomes a ``dagster.Failure`` naming the fix, by the core's error table."""

from dagster import Failure, MetadataValue

from controltable import error_outcome

#: Where the core's fix points at a setting or a call, the place it has in Dagster, per
#: :attr:`~controltable.ErrorOutcome.kind`. Only words: whether a step may be retried, and which
#: kind an error is, come from :func:`controltable.error_outcome` alone.
DAGSTER_HINTS: dict[str, str] = {
    "control-table login failed (authentication)": "the `url` of ControlTableResource (e.g. "
                                                   "EnvVar('CONTROLTABLE_URL'))",
    "control-table database missing": "the `url` of ControlTableResource",
    "control-table database unreachable": "the `url` of ControlTableResource (e.g. EnvVar('CONTROLTABLE_URL'))",
    "control-table statement timed out": "`statement_timeout` of ControlTableResource",
    "connection pooler in the way": "`listen_url` of ControlTableResource",
    "event table not prepared": "ControlTableResource.events(TABLE, key=KEY, prepare=True)",
    "control tables not installed": "ControlTableResource.install()",
    "unknown controltable resource": "ControlTableResource.set_capacity(name, n)",
    "lease lost, work interrupted": "interrupt_on_lease_loss=False of ControlTableResource, or interrupt=False "
                                    "per call",
}


def as_failure(exc: BaseException, action: str, *, url: str = "", namespace: str = "") -> Failure:
    """Turn a controltable error (every database failure reaches the integration as one) into a ``Failure``
    that says what to change.

    Kind, fix and whether Dagster may retry the step are the core's :func:`~controltable.error_outcome`,
    the table the Airflow provider and the CLI follow too: connection problems, busy databases, slots
    not granted in time and lost leases allow retries; logins, missing tables, privileges and
    configuration do not, because retrying cannot fix them. :data:`DAGSTER_HINTS` adds where the
    fix's setting lives in Dagster.
    """
    outcome = error_outcome(exc)
    where = f" (control table at {url}, namespace {namespace!r})" if url else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    hint = DAGSTER_HINTS.get(outcome.kind)
    fix = f"{outcome.fix}; in Dagster: {hint}" if hint else outcome.fix
    return Failure(
        description=f"{outcome.kind} while {action}{where}: {first}. Fix: {fix}.",
        metadata={"error": MetadataValue.text(f"{type(exc).__name__}: {first}"),
                  "control_table": MetadataValue.text(url or "?")},
        allow_retries=outcome.retryable,
    )
