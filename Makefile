# The two commands of the README, and the rest of the developer loop.
#   make demo   - the main job: worker processes contend for a slot and drain events on SQLite
#   make test   - the whole suite (SQLite always; PostgreSQL/MariaDB when reachable, see README)
# Both create their own virtual environments and install what they need.
#   make check  - the contributors' quick loop, under 5 minutes: make lint, then the core, web and repository
#                 tests on SQLite and PostgreSQL without the multi-process stress tests (scripts/run-tests --check)
#   make lint   - ruff check . and mypy over the four packages (CI runs it before the tests)
#   make docs   - the documentation site, mkdocs build --strict into site/ (CI runs it too)
#   make dist   - the four wheels and sdists in dist/, twine-checked, installed into a clean venv and tried
#                 (imports, --version, Airflow entry points, the Prefect block, the README's snippets); CI runs it too

PYTHON ?= python3
VENV ?= .venv
VENV_SA14 ?= .venv-sa14
# Prefect 3 pins FastAPI and friends that Airflow 3's api-server needs other versions of: the Prefect
# integration gets its own environment, and scripts/run-tests runs tests/prefect under it.
VENV_PREFECT ?= .venv-prefect
BIN := $(VENV)/bin

.PHONY: demo test check test-airflow-live test-prefect-live test-cross-live faults soak lint docs docs-serve sql bench dist clean

$(VENV)/.core-installed: core/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e 'core[postgres,mysql,async]'
	touch $@

# Debian packages the tests drive as real programs (chromium, promtool, pgbouncer, galera-4, rsync):
# scripts/system-packages installs the missing ones.
# The provider builds with hatchling, whose editable install leaves no egg-info in airflow_plugin/src
# (one there made Airflow see the plugin's entry point twice and report a duplicate plugin).
$(VENV)/.all-installed: $(VENV)/.core-installed pyproject.toml airflow_plugin/pyproject.toml dagster_plugin/pyproject.toml
	scripts/system-packages
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/pip install --quiet -e 'core[postgres,mysql,web,async]' -e 'airflow_plugin[web]' \
		-e dagster_plugin --group dev
	touch $@

$(VENV_SA14)/.installed: core/pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV_SA14)
	$(VENV_SA14)/bin/pip install --quiet --upgrade pip
	$(VENV_SA14)/bin/pip install --quiet 'SQLAlchemy>=1.4.36,<2' PyMySQL pytest pytest-timeout opentelemetry-sdk -e core
	touch $@

$(VENV_PREFECT)/.installed: core/pyproject.toml prefect_plugin/pyproject.toml
	$(PYTHON) -m venv $(VENV_PREFECT)
	$(VENV_PREFECT)/bin/pip install --quiet --upgrade pip
	$(VENV_PREFECT)/bin/pip install --quiet -e 'core[postgres,mysql,async]' -e prefect_plugin pytest pytest-timeout psutil \
	  opentelemetry-sdk opentelemetry-exporter-otlp-proto-http opentelemetry-distro
	touch $@

# The documentation site's tools only (mkdocstrings reads the sources statically, so the plugins' heavy
# dependencies are not needed to build the API reference).
$(VENV)/.docs-installed: $(VENV)/.core-installed pyproject.toml
	$(BIN)/pip install --quiet --group docs
	touch $@

demo: $(VENV)/.core-installed
	cd $(CURDIR) && $(BIN)/controltable --url sqlite:///demo.db demo

test: $(VENV)/.all-installed $(VENV_SA14)/.installed $(VENV_PREFECT)/.installed
	VENV=$(VENV) VENV_SA14=$(VENV_SA14) VENV_PREFECT=$(VENV_PREFECT) scripts/run-tests

# The quick loop before a commit: lint, then what needs no deployment, throwaway server or browser, on SQLite
# and PostgreSQL (required: a local server at 127.0.0.1:5432/test, or CONTROLTABLE_TEST_POSTGRES_URL).
# PYTEST_ARGS go to pytest, e.g. make check PYTEST_ARGS="--durations=20 -x".
check: lint
	VENV=$(VENV) VENV_SA14=$(VENV_SA14) VENV_PREFECT=$(VENV_PREFECT) scripts/run-tests --check $(PYTEST_ARGS)

# The fault suite alone (part of `make test` too), printing its figures: throwaway servers, restarts, cut COMMITs.
faults: $(VENV)/.all-installed
	$(BIN)/python -m pytest tests/faults -m faults -s -p no:cacheprovider

# A 10-minute soak against SOAK_URL (not a test): RSS and connection counts over time.
soak: $(VENV)/.core-installed
	$(BIN)/python benchmarks/soak.py --minutes $${SOAK_MINUTES:-10} --url "$$SOAK_URL"

# The Prefect integration against a running server and process worker (part of `make test` too).
test-prefect-live: $(VENV_PREFECT)/.installed
	$(VENV_PREFECT)/bin/python -m pytest tests/prefect/test_prefect_live.py -v -s

test-airflow-live: $(VENV)/.all-installed
	$(BIN)/python -m pytest tests/airflow/test_airflow_live.py -v

# The cross-orchestrator test (part of `make test` too): Airflow, Dagster, Prefect and `controltable run`
# contending for one resource at once, each deployment running; Prefect under its own interpreter.
test-cross-live: $(VENV)/.all-installed $(VENV_PREFECT)/.installed
	CONTROLTABLE_TEST_PREFECT_PYTHON=$(VENV_PREFECT)/bin/python $(BIN)/python -m pytest tests/live -v -s

# ruff over the repository, mypy over the three packages (configured in pyproject.toml [tool.mypy]).
lint: $(VENV)/.all-installed
	$(BIN)/ruff check .
	$(BIN)/mypy

# The documentation site in strict mode: a broken link, a missing page or an API object mkdocstrings
# cannot find fails the build. Output in site/.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

sql: $(VENV)/.core-installed
	$(BIN)/controltable sql --dialect mssql

bench:
	benchmarks/run

# A release as it would be published (scripts/dist; see CONTRIBUTING.md "Releases"): build tools in .venv-dist,
# the check in a temporary clean venv. Nothing is left in the checkout but dist/.
dist:
	scripts/dist

clean:
	rm -rf $(VENV) $(VENV_SA14) $(VENV_PREFECT) .venv-dist dist demo.db demo.db-* .pytest_cache site
