-- walbox inbox: the consumer half's deduplication table.
--
-- One row per (consumer, message_id) that `walbox inbox` processed. The row is inserted with
-- INSERT … ON CONFLICT DO NOTHING in the same transaction as the effect, so a row exists if and
-- only if the effect committed. message_id is the producer's event id (the `id` header), never a
-- Kafka offset: offsets change on replay, event ids do not.
--
-- Keep rows for longer than the topics' replay window (retention.ms + segment.ms): `walbox inbox`
-- refuses to start otherwise (retention.guard). Rows older than retention.keep can be deleted by
-- walbox's clean-up job (retention.cleanup = true), in small batches.

CREATE TABLE IF NOT EXISTS inbox (
    consumer         text        NOT NULL,
    message_id       text        NOT NULL,
    processed_at     timestamptz NOT NULL DEFAULT now(),

    -- Optional: filled only with [effect] store_record = true (the transactional-inbox form,
    -- where the application processes stored records itself). Drop them if you use an effect.
    topic            text,
    kafka_partition  integer,
    kafka_offset     bigint,
    message_key      text,
    headers          jsonb,
    payload          jsonb,
    -- Never written by walbox: for the application's own processing in the stored form.
    handled_at       timestamptz,

    PRIMARY KEY (consumer, message_id)
);

-- The retention clean-up deletes by age, per consumer.
CREATE INDEX IF NOT EXISTS inbox_consumer_processed_at_idx ON inbox (consumer, processed_at);

-- Stored form: the application's queue of records still to handle.
CREATE INDEX IF NOT EXISTS inbox_unhandled_idx ON inbox (consumer, processed_at)
    WHERE handled_at IS NULL AND payload IS NOT NULL;

-- A table that is mostly inserts and age-ordered deletes: vacuum it early.
ALTER TABLE inbox SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
