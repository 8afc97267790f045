#!/bin/sh
# One-shot (the `temporal-schema` service): create Temporal's two PostgreSQL databases and bring
# their schemas to the version this admin-tools image ships. Safe to run again: it runs on every
# `docker compose up`, and `update-schema` is how a newer Temporal image migrates them.
set -eu
: "${POSTGRES_SEEDS:?POSTGRES_SEEDS must name the PostgreSQL host}"
: "${POSTGRES_USER:?POSTGRES_USER must be set}"
: "${SQL_PASSWORD:?SQL_PASSWORD must be set}"
port=${DB_PORT:-5432}
schemas=/etc/temporal/schema/postgresql/v12

sql() {  # temporal-sql-tool on database $db (SQL_PASSWORD is read from the environment)
    temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p "$port" \
        -u "$POSTGRES_USER" --db "$db" "$@"
}

for db in temporal temporal_visibility; do
    case $db in
        temporal) dir=$schemas/temporal/versioned ;;
        *) dir=$schemas/visibility/versioned ;;
    esac
    if sql create; then
        echo "schema: created database $db"
        sql setup-schema -v 0.0
    fi
    # on a database that exists already, only update-schema: setup-schema would record version
    # 0.0 over the real one. update-schema applies the versions newer than the recorded one.
    sql update-schema -d "$dir" || {
        echo "schema: cannot bring $db up to date (a first setup that stopped half way leaves a"
        echo "schema: database without a schema: \`docker compose down -v\` starts afresh)"
        exit 1
    }
done
echo "schema: ready"
