#!/usr/bin/env bash
# Parse and run the Airflow example DAGs with `airflow dags list` / `airflow dags test` in a
# throw-away AIRFLOW_HOME, against an embedded SQLite control table. For CI (.ci/run) and by hand:
#   example_dags/airflow/run_examples.sh [path/to/bin/airflow]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
airflow="${1:-airflow}"
home="$(mktemp -d -t ct-airflow-examples-XXXXXX)"
trap 'rm -rf "$home"' EXIT
export AIRFLOW_HOME="$home"
export AIRFLOW__CORE__DAGS_FOLDER="$here"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW_CONN_CONTROLTABLE_DEFAULT="{\"conn_type\": \"controltable\", \"extra\": {\"url\": \"sqlite:///$home/controltable.db\"}}"

"$airflow" db migrate > "$home/migrate.log" 2>&1 || { cat "$home/migrate.log"; exit 1; }
"$airflow" providers list 2>/dev/null | grep -q airflow-provider-controltable \
    || { echo "airflow-provider-controltable is not listed by 'airflow providers list'"; exit 1; }
"$airflow" dags reserialize > "$home/reserialize.log" 2>&1 || { cat "$home/reserialize.log"; exit 1; }
listed="$("$airflow" dags list -o plain 2>/dev/null)"
for dag in controltable_warehouse_load controltable_warehouse_slot controltable_event_batches controltable_worklist; do
    grep -q "$dag" <<<"$listed" || { echo "$dag not listed by 'airflow dags list'"; exit 1; }
done
errors="$("$airflow" dags list-import-errors -o plain 2>/dev/null || true)"
if grep -q "example_dags" <<<"$errors"; then echo "$errors"; exit 1; fi
for dag in controltable_warehouse_load controltable_warehouse_slot controltable_event_batches controltable_worklist; do
    if "$airflow" dags test "$dag" > "$home/$dag.log" 2>&1; then
        echo "ok   airflow dags test $dag"
    else
        tail -60 "$home/$dag.log"; echo "FAIL airflow dags test $dag"; exit 1
    fi
done
