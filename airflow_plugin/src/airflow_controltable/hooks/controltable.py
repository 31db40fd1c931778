"""``ControlTableHook``: a :class:`controltable.ControlTable` for an Airflow connection.

Two kinds of connection work:

* the provider's own ``controltable`` type, holding a SQLAlchemy URL (in the ``url`` extra, or in
  Host), with ``namespace``, ``schema`` and ``prefix`` extras; a Password field, if set, fills the
  URL's password so the secret stays out of the extras;
* any connection whose hook is a SQL ``DbApiHook`` (postgres, mysql, mssql, odbc, sqlite, ...), so
  the control tables live beside the data of a connection you already have. The namespace and the
  control-table schema then come from the hook's arguments.

One ``ControlTable`` (and so one connection pool) is kept per process and per database/namespace:
the triggerer runs many triggers in one process and must not open a pool per trigger.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from sqlalchemy.engine import make_url  # URL parsing only: the plugin builds no SQL

from airflow_controltable.exceptions import ControlTableConnectionError, ControlTableConnectionNotFound
from airflow_controltable.utils import translate
from controltable import ControlTable, ControlTableError
from controltable.errors import redact, safe_url

DEFAULT_CONN_ID = "controltable_default"
CONN_TYPE = "controltable"

_CACHE: dict[tuple[str, str, Optional[str], str, Optional[str]], ControlTable] = {}
_CACHE_LOCK = threading.Lock()


def _conn_env_example(conn_id: str) -> str:
    return (
        f"AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\": \"controltable\", "
        f"\"extra\": {{\"url\": \"postgresql+psycopg://user@host:5432/db\", \"namespace\": \"default\"}}}}'"
    )


class ControlTableHook(BaseHook):
    """Give tasks, sensors and triggers a :class:`~controltable.ControlTable` for ``conn_id``.

    :param conn_id: an Airflow connection of type ``controltable`` or any SQL (DbApiHook) type.
    :param namespace: separates deployments sharing one database; overrides the connection's
        ``namespace`` extra (default ``"default"``). Everyone who must coordinate uses the same one.
    :param schema: the database schema holding the control tables (not the event tables); overrides
        the ``schema`` extra.
    :param prefix: table-name prefix of the control tables (default ``ct_``).
    """

    conn_name_attr = "conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "ControlTable"

    def __init__(
        self,
        conn_id: str = DEFAULT_CONN_ID,
        *,
        namespace: Optional[str] = None,
        schema: Optional[str] = None,
        prefix: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.namespace = namespace
        self.schema = schema
        self.prefix = prefix

    # -- Airflow UI -------------------------------------------------------------------------------
    # The connection form (the URL in the Host field, relabelled; namespace, schema, prefix,
    # listen_url, install in extras) is declared in get_provider_info's "conn-fields" /
    # "ui-field-behaviour", the Airflow 3.2+ way; the classmethod gives the same to older UIs.
    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The form's standard fields for Airflow versions that ask the hook (3.0/3.1 with FAB)."""
        from airflow_controltable.get_provider_info import UI_FIELD_BEHAVIOUR

        return {key.replace("-", "_"): value for key, value in UI_FIELD_BEHAVIOUR.items()}

    # -- resolution -------------------------------------------------------------------------------
    def _connection(self) -> Any:
        try:
            return self.get_connection(self.conn_id)
        except AirflowNotFoundException as exc:
            if not reads_stored_connections():
                raise ControlTableConnectionNotFound(
                    f"connection {self.conn_id!r} was not found by this process, which is not an Airflow task: "
                    "in Airflow 3 a plain script cannot read connections stored in the metadata database (only "
                    "tasks, the triggerer and Airflow's servers can). Give this script the connection in its "
                    f"environment, e.g. {_conn_env_example(self.conn_id)}, or skip Airflow and pass the URL: "
                    "controltable.ControlTable('postgresql+psycopg://user@host:5432/db', namespace=...)"
                ) from exc
            raise ControlTableConnectionNotFound(
                f"connection {self.conn_id!r} is not defined in Airflow. Create it in the UI or with "
                f"`airflow connections add`, e.g. {_conn_env_example(self.conn_id)}, or pass conn_id= the id of "
                "an existing SQL connection (postgres, mysql, mssql, odbc, sqlite)"
            ) from exc

    def get_uri(self) -> str:
        """The SQLAlchemy URL of the control database, password included (never log it)."""
        return self._resolve()[0]

    def _resolve(self) -> tuple[str, dict[str, Any]]:
        """Return (SQLAlchemy URL with password, extras that configure the control table)."""
        conn = self._connection()
        if conn.conn_type == CONN_TYPE:
            extras = _form_extras(conn.extra_dejson or {})
            url = extras.pop("url", None) or conn.host
            if not url or "://" not in str(url):
                raise ControlTableConnectionError(
                    f"connection {self.conn_id!r} (type controltable) has no SQLAlchemy URL; put one in its 'url' "
                    "extra or its Host field, e.g. postgresql+psycopg://user@host:5432/db or "
                    "sqlite:////var/lib/airflow/controltable.db"
                )
            parsed = self._parse(url, conn.password)
            if conn.password and not parsed.password:
                parsed = parsed.set(password=conn.password)
            listen = extras.get("listen_url")
            if listen and conn.password and "://" in str(listen):
                # The listener's direct URL logs in as the same user: the Password field fills it too.
                direct = self._parse(listen, conn.password, field="listen_url")
                if not direct.password:
                    extras["listen_url"] = direct.set(password=conn.password).render_as_string(hide_password=False)
            return parsed.render_as_string(hide_password=False), extras
        return self._url_from_sql_hook(conn), {}

    def _parse(self, url: object, password: Optional[str], field: str = "url") -> Any:
        """``url`` as a SQLAlchemy URL, or the connection error naming it with its password masked
        (SQLAlchemy 1.4's own parse error quotes the whole string, password included)."""
        try:
            return make_url(str(url))
        except Exception as exc:  # SQLAlchemy's ArgumentError (not a URL), ValueError (a bad port)
            raise ControlTableConnectionError(
                f"connection {self.conn_id!r}: its {field} {safe_url(str(url))!r} is not a SQLAlchemy URL "
                f"({redact(exc, [password])})"
            ) from None

    def _url_from_sql_hook(self, conn: Any) -> str:
        from airflow.providers.common.sql.hooks.sql import DbApiHook

        try:
            hook = conn.get_hook()
        except Exception as exc:
            if conn.conn_type == "sqlite" and conn.host:
                # The sqlite provider is optional; its connections keep the file path in Host.
                return f"sqlite:///{conn.host}"
            raise ControlTableConnectionError(
                f"connection {self.conn_id!r} has type {conn.conn_type!r}, which has no usable hook here "
                f"({redact(exc, [conn.password])}); "
                "use a connection of type 'controltable' or of a SQL type whose provider is installed "
                "(postgres, mysql, mssql, odbc, sqlite)"
            ) from exc
        if not isinstance(hook, DbApiHook):
            raise ControlTableConnectionError(
                f"connection {self.conn_id!r} has type {conn.conn_type!r}, whose hook {type(hook).__name__} is not a "
                "SQL hook (DbApiHook), so it cannot hold control tables; point conn_id at a 'controltable' "
                "connection or a SQL connection (postgres, mysql, mssql, odbc, sqlite)"
            )
        try:
            url = hook.sqlalchemy_url
            return str(url.render_as_string(hide_password=False))
        except NotImplementedError:
            return str(hook.get_uri())

    # -- the control table ----------------------------------------------------------------------
    def get_conn(self) -> ControlTable:
        """Same as :meth:`get_control_table` (the name Airflow hooks conventionally use)."""
        return self.get_control_table()

    def get_control_table(self) -> ControlTable:
        """The process-wide :class:`~controltable.ControlTable` for this connection and namespace.

        Raises a task error naming the fix for an unknown connection id, a connection that is not
        SQL, or a bad URL or namespace. Set the ``install`` extra to true to create the control
        tables on first use (needs DDL rights; otherwise run ``controltable init`` once).
        """
        url, extras = self._resolve()
        namespace = self.namespace or extras.get("namespace") or "default"
        schema = self.schema if self.schema is not None else extras.get("schema")
        prefix = self.prefix if self.prefix is not None else extras.get("prefix", "ct_")
        listen_url = extras.get("listen_url") or None  # None: CONTROLTABLE_LISTEN_URL, else a self-probed listener
        key = (url, str(namespace), schema, str(prefix), listen_url)
        with _CACHE_LOCK:
            table = _CACHE.get(key)
            if table is None or _CACHE_PID.get(id(table)) != os.getpid():
                try:
                    table = ControlTable(url, namespace=namespace, schema=schema, prefix=prefix,
                                         listen_url=listen_url)
                    if _truthy(extras.get("install")):
                        table.install()
                except ControlTableError as exc:
                    err = translate(exc)
                    raise type(err)(f"connection {self.conn_id!r}: {err}") from exc
                _CACHE[key] = table
                _CACHE_PID[id(table)] = os.getpid()
        return table

    def test_connection(self) -> tuple[bool, str]:
        """The UI's Test button: parse the URL, reach the database, report the control tables' state.

        Fails (with the fix) on a missing or malformed URL, an unreachable database or bad
        credentials, a bad namespace or schema, and control tables newer than this provider.
        Missing control tables pass with a note, since ``controltable init`` creates them.
        """
        try:
            table = self.get_control_table()
            version = table.installed_version()
            if version is not None:
                table.status()  # the control tables are readable with these rights
        except Exception as exc:
            return False, str(exc)
        if version is None:
            return True, f"reached {table!r}; control tables not installed yet (run `controltable init`)"
        return True, f"reached {table!r}; control tables at schema version {version}"


_CACHE_PID: dict[int, int] = {}


def reads_stored_connections() -> bool:
    """Whether this process can see connections stored in Airflow's metadata database.

    Airflow 3 gives them to a task through its supervisor (``SUPERVISOR_COMMS``), and to its own
    processes (api-server, scheduler, triggerer: ``_AIRFLOW_PROCESS_CONTEXT``); any other process,
    a plain ``python script.py``, sees environment variables and secrets backends only, so a
    connection that exists in the UI is "not defined" there. The same test as Airflow's own choice
    of secrets backends (``ensure_secrets_backend_loaded``).
    """
    if os.environ.get("_AIRFLOW_PROCESS_CONTEXT") in ("server", "client"):
        return True
    try:
        from airflow.sdk.execution_time import task_runner
    except ImportError:  # an Airflow without the task SDK's split reads the database itself
        return True
    return getattr(task_runner, "SUPERVISOR_COMMS", None) is not None


def _form_extras(extra: dict[str, Any]) -> dict[str, Any]:
    """The extras, accepting the form's ``extra__controltable__<field>`` names and dropping empty values."""
    out: dict[str, Any] = {}
    prefix = f"extra__{CONN_TYPE}__"
    for key, value in extra.items():
        name = key[len(prefix):] if key.startswith(prefix) else key
        if value is None or value == "":
            continue
        out.setdefault(name, value)
    return out


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def clear_cache() -> None:
    """Close and forget the cached control tables (for tests and after forking)."""
    with _CACHE_LOCK:
        for table in _CACHE.values():
            table.close()
        _CACHE.clear()
        _CACHE_PID.clear()


class UsesControlTable:
    """Mixin for operators, sensors and triggers: open the control table their arguments name.

    Subclasses store ``conn_id``, ``namespace`` and ``control_schema`` in ``__init__`` (operators
    do no work there); ``_table()`` opens it when the work runs.
    """

    conn_id: str
    namespace: Optional[str]
    control_schema: Optional[str]

    def _table(self) -> Any:
        return ControlTableHook(self.conn_id, namespace=self.namespace, schema=self.control_schema).get_control_table()

