#!/usr/bin/env bash
# First start of the compose stack's PostgreSQL (docker-entrypoint-initdb.d, run once on an
# empty data directory, as the superuser): the application's database `app` with the outbox
# (migrations/outbox.sql), the roles of the writer and walbox (which may delete old outbox
# rows: outbox retention), walbox's publication, and the consumer's database `billing` with the
# inbox (migrations/inbox.sql) and the table its effect writes. The passwords are for a local
# demonstration only.
#
# Outside the container (examples/stack_sample.rs runs it on a throwaway cluster): PGHOST and
# PGPORT name the server, POSTGRES_USER a superuser, MIGRATIONS_DIR the repository's migrations/.
set -euo pipefail
psql=(psql -X -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password)
migrations=${MIGRATIONS_DIR:-/walbox/migrations}

"${psql[@]}" --dbname app -f "$migrations/outbox.sql"
"${psql[@]}" --dbname app <<'SQL'
CREATE TABLE payments (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    wallet_id text    NOT NULL,
    amount    numeric NOT NULL
);
-- The service: writes a payment and its outbox row in one transaction.
CREATE ROLE app LOGIN PASSWORD 'app';
GRANT INSERT, SELECT ON payments, outbox TO app;
-- walbox: streams the slot and reads the outbox (an existing role is kept: the throwaway
-- cluster of examples/stack_sample.rs already has one of that name, its superuser).
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'walbox') THEN
        CREATE ROLE walbox LOGIN REPLICATION PASSWORD 'walbox';
    END IF;
END $$;
GRANT SELECT ON outbox TO walbox;
-- [outbox.retention] deletes rows once Kafka has them.
GRANT DELETE ON outbox TO walbox;
CREATE PUBLICATION walbox FOR TABLE outbox WITH (publish = 'insert');
SQL

"${psql[@]}" --dbname postgres -c "CREATE ROLE billing LOGIN PASSWORD 'billing'"
"${psql[@]}" --dbname postgres -c "CREATE DATABASE billing OWNER billing"
billing=(env PGPASSWORD=billing psql -X -v ON_ERROR_STOP=1 --username billing --dbname billing)
"${billing[@]}" -f "$migrations/inbox.sql"
"${billing[@]}" <<'SQL'
-- What the inbox's effect writes: one ledger line per payment, applied once. A zero amount
-- breaks the CHECK, so such an event is retried, then dead-lettered.
CREATE TABLE ledger (
    payment_id bigint  PRIMARY KEY,
    wallet_id  text    NOT NULL,
    amount     numeric NOT NULL CHECK (amount > 0)
);
SQL
