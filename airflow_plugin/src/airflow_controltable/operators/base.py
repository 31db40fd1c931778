"""The connection plumbing every controltable operator shares: which control table to use."""

from __future__ import annotations

from typing import Any, Optional

from airflow.sdk import BaseOperator

from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, UsesControlTable


class ControlTableBaseOperator(UsesControlTable, BaseOperator):
    """Stores the connection arguments (``__init__`` does no work); ``_table()`` opens it in ``execute``."""

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.namespace = namespace
        self.control_schema = control_schema
