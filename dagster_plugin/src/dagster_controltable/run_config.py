"""Run config that configures the resource: the definitions' fields it leaves out are kept, a reset namespace named."""

import os
from typing import Any, Mapping, Optional

from pydantic import BaseModel, TypeAdapter


def _defined_config(context: Any) -> Optional[Mapping[str, Any]]:
    """The resource's configuration as the code location's definitions give it (config keys), if known."""
    try:
        defined = context.resource_def.config_schema.as_field().default_value
    except Exception:  # no definition defaults (a resource built by hand)
        return None
    return defined if isinstance(defined, Mapping) else None


def _run_config_of(context: Any) -> Optional[Mapping[str, Any]]:
    """The keys this run's own run config gives for this resource (None: it does not configure it)."""
    run = getattr(context, "dagster_run", None)
    resources = ((getattr(run, "run_config", None) or {}).get("resources") or {}) if run is not None else {}
    for key, definition in (getattr(context, "all_resource_defs", None) or {}).items():
        if definition is context.resource_def and isinstance(resources.get(key), Mapping):
            config = resources[key].get("config")
            return config if isinstance(config, Mapping) else None
    return None


def keep_defined_fields(resource: BaseModel, context: Any) -> list[str]:
    """Give back the definitions' values of the fields this run's run config leaves out; returns their keys.

    ``resource`` is the run's ``ControlTableResource``, taken as the pydantic model it is: its fields
    are all this reads, and this module stays below the resource, which imports it.

    Dagster replaces a Pythonic resource's whole configuration when run config names the resource,
    so run config giving only ``url`` (the usual override) would reset ``namespace``, ``prefix``,
    the schema and the timeouts to their defaults: the run would queue in another namespace and
    share no limit with the rest. Fields the run config does give win; an ``EnvVar`` in the
    definitions is read from this process's environment (left at the default when unset).
    """
    defined, given = _defined_config(context), _run_config_of(context)
    if defined is None or not given:
        return []
    kept = []
    for name, field in type(resource).model_fields.items():
        key = field.alias or name
        if key in given or key not in defined:
            continue
        value = defined[key]
        if isinstance(value, Mapping) and "env" in value:  # EnvVar("NAME") in the definitions
            value = os.environ.get(str(value["env"]))
            if value is None:
                continue
            value = TypeAdapter(field.annotation or Any).validate_python(value)  # "30" -> 30.0 for a float
        if value != getattr(resource, name):
            # The run's copy of the resource, before anything reads it (pydantic keeps fields in
            # __dict__; the model is frozen against callers, not against this repair).
            object.__setattr__(resource, name, value)
            kept.append(key)
    return kept


def namespace_override_note(namespace: str, context: Any) -> Optional[str]:
    """A warning if this run's namespace differs from the one the code location's definitions give
    although the run config did not choose it (one :func:`keep_defined_fields` could not keep: an
    ``EnvVar`` unset in this process, a run config Dagster does not show the resource)."""
    defined = _defined_config(context)
    if defined is None:
        return None
    given = _run_config_of(context)
    if given is not None and "namespace" in given:
        return None  # the run config chose this namespace itself
    value = defined.get("namespace", "default")
    if isinstance(value, Mapping) and "env" in value:  # EnvVar in the definitions
        value = os.environ.get(str(value["env"]), value)
    if not isinstance(value, str) or value == namespace:
        return None
    return (f"controltable: this run uses namespace {namespace!r}, but the code location's definitions give "
            f"{value!r}. Run config that configures this resource replaces its whole configuration, so fields "
            f"it leaves out fall back to their defaults: this run does not share limits with runs in "
            f"{value!r}. Give `namespace` in the run config too (or set it only in the definitions).")
