-- The outbox table walbox relays with its default mapping (the seeds' schema).
--
-- A service writes its business change and one row here in the same transaction; walbox reads
-- the INSERT from the WAL and produces it to `topic`, keyed by `aggregate_id`, with `id` in the
-- record's `id` header. Rows are never updated. walbox needs SELECT on the table and a
-- publication for its INSERTs:
--
--   GRANT SELECT ON outbox TO walbox;
--   CREATE PUBLICATION walbox FOR TABLE outbox WITH (publish = 'insert');

CREATE TABLE IF NOT EXISTS outbox (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_id  text        NOT NULL,  -- Kafka key: one aggregate's events keep their order
    topic         text        NOT NULL,
    event_type    text        NOT NULL,  -- header `event_type`
    payload       jsonb       NOT NULL,  -- record value, as stored
    created_at    timestamptz NOT NULL DEFAULT now()
);
