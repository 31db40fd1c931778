"""Fake driver exceptions carrying the codes each driver really uses, where that driver keeps them.

The error classification recognises a driver's error by its class's module and its code, never
by the message's wording; SQL Server and Oracle cannot run here, so their errors are built here:
one set of fakes for every test that classifies errors (``errorcodes``, DDL lock and
already-applied checks), so the codes' places are spelled once.
"""

from __future__ import annotations

from typing import Optional


def driver_class(module: str, name: str = "OperationalError") -> type[Exception]:
    """An exception class that looks like the driver's: ``module``'s ``name``."""
    return type(name, (Exception,), {"__module__": module})


def psycopg_error(sqlstate: Optional[str], message: str = "boom", name: str = "OperationalError") -> Exception:
    """psycopg 3: ``exc.sqlstate``."""
    exc = driver_class("psycopg.errors", name)(message)
    exc.sqlstate = sqlstate  # type: ignore[attr-defined]
    return exc


def psycopg2_error(pgcode: Optional[str], message: str = "boom") -> Exception:
    """psycopg2: ``exc.pgcode`` and ``exc.pgerror``."""
    exc = driver_class("psycopg2.errors")(message)
    exc.pgcode = pgcode  # type: ignore[attr-defined]
    exc.pgerror = None if pgcode is None else message  # type: ignore[attr-defined]
    return exc


def pyodbc_error(number: int, state: str = "42000", name: str = "ProgrammingError") -> Exception:
    """pyodbc (SQL Server): the SQLSTATE as ``args[0]``, the native error number in the message."""
    return driver_class("pyodbc", name)(
        state, f"[{state}] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Something ({number}) (SQLExecDirectW)"
    )


class _OracleError:
    """python-oracledb's ``_Error``: ``exc.args[0]`` with ``full_code`` and ``message``."""

    def __init__(self, full_code: str) -> None:
        self.full_code = full_code
        self.message = f"{full_code}: something"

    def __str__(self) -> str:
        return self.message


def oracle_error(full_code: str, name: str = "DatabaseError") -> Exception:
    """python-oracledb: ``exc.args[0].full_code`` (``ORA-00054``)."""
    return driver_class("oracledb.exceptions", name)(_OracleError(full_code))
