"""URLs as people type them: ``postgres://``, ``postgresql://``, ``mysql://``, ``mariadb://``.

Each is made explicit when one driver is the unambiguous choice (``connect.typed_url``), or refused
with a ``ConfigurationError`` that says what to install and what to type, its password masked.
"""

from __future__ import annotations

from typing import Callable

import pytest
from sqlalchemy.engine import make_url

import controltable
from controltable import ConfigurationError
from controltable.connect import typed_url

SECRET = "s3cr3t-pw"


def installed(*modules: str) -> Callable[[str], bool]:
    return lambda module: module in modules


@pytest.mark.parametrize(("typed", "modules", "meant"), [
    ("postgres://u@h:5432/db", ("psycopg", "psycopg2"), "postgresql+psycopg"),
    ("postgresql://u@h:5432/db", ("psycopg", "psycopg2"), "postgresql+psycopg"),
    ("postgres://u@h:5432/db", ("psycopg2",), "postgresql+psycopg2"),
    ("postgres+psycopg2://u@h:5432/db", ("psycopg",), "postgresql+psycopg2"),  # a named driver is kept
    ("postgresql+psycopg://u@h:5432/db", (), "postgresql+psycopg"),
    ("mysql://u@h:3306/db", ("pymysql",), "mysql+pymysql"),
    ("mariadb://u@h:3306/db", ("pymysql",), "mysql+pymysql"),
    ("mysql://u@h:3306/db", ("pymysql", "MySQLdb"), "mysql+mysqldb"),  # SQLAlchemy's own default, installed
    ("mariadb+pymysql://u@h:3306/db", (), "mysql+pymysql"),
    ("sqlite:///x.db", (), "sqlite"),
    ("mssql+pyodbc://u@dsn", (), "mssql+pyodbc"),
])
def test_common_spellings_name_the_installed_driver(typed: str, modules: tuple[str, ...], meant: str) -> None:
    url = typed_url(make_url(typed), installed(*modules))
    assert url.drivername == meant
    assert (url.host, url.database) == (make_url(typed).host, make_url(typed).database)


@pytest.mark.parametrize(("typed", "extra", "example"), [
    ("postgres", "postgres", "postgresql+psycopg://"),
    ("postgresql", "postgres", "postgresql+psycopg://"),
    ("mysql", "mysql", "mysql+pymysql://"),
    ("mariadb", "mysql", "mysql+pymysql://"),
])
def test_without_a_driver_the_error_says_what_to_install_and_type(typed: str, extra: str, example: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        typed_url(make_url(f"{typed}://user:{SECRET}@db-host/db"), installed())
    text = str(caught.value)
    assert f"pip install 'controltable[{extra}]'" in text and example in text, text
    assert SECRET not in text and "db-host" in text


def test_an_unknown_scheme_still_names_the_url_without_its_password() -> None:
    with pytest.raises(ConfigurationError) as caught:
        controltable.ControlTable(f"postgress://user:{SECRET}@db-host/db")
    assert "unknown database" in str(caught.value) and SECRET not in str(caught.value)


@pytest.mark.backends("postgres", "mysql")
def test_typed_spellings_reach_the_live_server(backend: str, backend_url: str) -> None:
    url = make_url(backend_url)
    spellings = ("postgres", "postgresql") if backend == "postgres" else ("mysql", "mariadb")
    for spelling in spellings:
        typed = url.set(drivername=spelling).render_as_string(hide_password=False)
        with controltable.ControlTable(typed, namespace="spelling") as ct:
            ct.ping()
            assert ct.engine.url.drivername == url.drivername, (typed, ct.engine.url.drivername)
