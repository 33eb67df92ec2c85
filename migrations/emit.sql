-- The table-less outbox: publish an event with a logical message instead of an outbox row.
--
-- SELECT walbox.emit('order', 'o-42', 'order.placed', '{"total": 12.5}');
--
-- Call it inside the transaction that makes the business change. The message is transactional
-- (pg_logical_emit_message(true, ...)): it reaches walbox only if the transaction commits, in
-- commit order, like an outbox row. No table is written, so there is nothing to vacuum,
-- partition or clean up.
-- walbox maps it with [outbox.messages] (prefix 'walbox.outbox' by default, PostgreSQL 14+).
-- The event id is a fresh UUID, returned to the caller and sent in the `id` header.
CREATE SCHEMA IF NOT EXISTS walbox;

CREATE OR REPLACE FUNCTION walbox.emit(
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    prefix         text DEFAULT 'walbox.outbox'
) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    event_id uuid := gen_random_uuid();
BEGIN
    PERFORM pg_logical_emit_message(
        true,
        prefix,
        jsonb_build_object(
            'id', event_id,
            'aggregate_type', aggregate_type,
            'aggregate_id', aggregate_id,
            'event_type', event_type,
            'payload', payload
        )::text
    );
    RETURN event_id;
END
$$;
