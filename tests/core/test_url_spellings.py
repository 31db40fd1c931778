"""URLs as people type them: ``postgres://``, ``postgresql://``, ``mysql://``, ``mariadb://``.

Each is made explicit when one driver is the unambiguous choice (``connect.typed_url``), or refused
with a ``ConfigurationError`` that says what to install and what to type, its password masked.
"""

from __future__ import annotations

import importlib.util
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
    url = typed_url(make_url(typed), installed(*modules), sqlalchemy_2=True)
    assert url.drivername == meant
    assert (url.host, url.database) == (make_url(typed).host, make_url(typed).database)


@pytest.mark.parametrize(("typed", "modules", "meant"), [
    ("postgresql://u@h:5432/db", ("psycopg", "psycopg2"), "postgresql+psycopg2"),
    ("postgres://u@h:5432/db", ("psycopg2",), "postgresql+psycopg2"),
    ("postgresql+psycopg2://u@h:5432/db", ("psycopg",), "postgresql+psycopg2"),  # a named driver is kept
    ("mysql://u@h:3306/db", ("pymysql",), "mysql+pymysql"),
])
def test_sqlalchemy_1_4_never_gets_psycopg_3(typed: str, modules: tuple[str, ...], meant: str) -> None:
    """SQLAlchemy 1.4 has no psycopg-3 dialect (it came with 2.0; Airflow 2 pins 1.4): there a
    plain URL means psycopg2 even when psycopg 3 is installed too."""
    assert typed_url(make_url(typed), installed(*modules), sqlalchemy_2=False).drivername == meant


@pytest.mark.parametrize("typed", ["postgres", "postgresql"])
def test_psycopg_3_alone_on_sqlalchemy_1_4_names_the_conflict(typed: str) -> None:
    """The ``postgres`` extra installs psycopg 3; under SQLAlchemy 1.4 the error says why it cannot
    be used and what to install and type instead (not SQLAlchemy's "Can't load plugin")."""
    with pytest.raises(ConfigurationError) as caught:
        typed_url(make_url(f"{typed}://user:{SECRET}@db-host/db"), installed("psycopg"), sqlalchemy_2=False)
    text = str(caught.value)
    assert "psycopg is installed" in text and "needs SQLAlchemy 2" in text, text  # the conflict
    assert "pip install psycopg2-binary" in text and "postgresql+psycopg2://" in text, text  # what to do
    assert SECRET not in text and "db-host" in text
    with pytest.raises(ConfigurationError, match="pip install psycopg2-binary") as caught:
        typed_url(make_url(f"{typed}://user:{SECRET}@db-host/db"), installed(), sqlalchemy_2=False)
    assert "psycopg is installed" not in str(caught.value)  # nothing installed: no conflict to name


def test_the_chosen_driver_has_a_dialect_in_this_sqlalchemy() -> None:
    """Run under each SQLAlchemy the project supports (the 1.4 lane too): whatever is installed,
    the URL a plain spelling becomes names a dialect the running SQLAlchemy can load."""
    for typed in ("postgres://u@h/db", "postgresql://u@h/db", "mysql://u@h/db", "mariadb://u@h/db"):
        url = typed_url(make_url(typed), installed("psycopg", "psycopg2", "pymysql"))
        url.get_dialect()  # NoSuchModuleError if this SQLAlchemy has no such dialect


@pytest.mark.parametrize(("typed", "extra", "example"), [
    ("postgres", "postgres", "postgresql+psycopg://"),
    ("postgresql", "postgres", "postgresql+psycopg://"),
    ("mysql", "mysql", "mysql+pymysql://"),
    ("mariadb", "mysql", "mysql+pymysql://"),
])
def test_without_a_driver_the_error_says_what_to_install_and_type(typed: str, extra: str, example: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        typed_url(make_url(f"{typed}://user:{SECRET}@db-host/db"), installed(), sqlalchemy_2=True)
    text = str(caught.value)
    assert f"pip install 'controltable[{extra}]'" in text and example in text, text
    assert SECRET not in text and "db-host" in text


@pytest.mark.skipif(importlib.util.find_spec("MySQLdb") is not None, reason="mysqlclient is installed here")
def test_a_named_driver_that_is_missing_names_its_own_package() -> None:
    """``mysql+mysqldb://`` needs mysqlclient, which no extra installs: the advice names that
    package (it named every extra at once), from the same driver table ``typed_url`` reads."""
    with pytest.raises(ConfigurationError) as caught:
        controltable.ControlTable(f"mysql+mysqldb://user:{SECRET}@db-host/db")
    text = str(caught.value)
    assert "pip install mysqlclient" in text and "controltable[" not in text, text
    assert SECRET not in text


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
