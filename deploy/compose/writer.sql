-- The compose stack's writer: a payment and its outbox row in one transaction, ten
-- transactions a second, about :rate events a second, the rate swinging ±50% over ten
-- minutes so the dashboard moves. One event in two thousand goes to a topic that does not
-- exist (walbox dead-letters it) and one in a thousand has a zero amount (the inbox's
-- effect refuses it, retries, dead-letters it).
--
--   psql -v rate=200 -f writer.sql
SELECT set_config('writer.rate', :'rate', false);

DO $$
DECLARE
    rate constant numeric := current_setting('writer.rate')::numeric;
    tick bigint := 0;
    n    int;
BEGIN
    LOOP
        n := greatest(1, round(rate / 10 * (1 + 0.5 * sin(tick * 2 * pi() / 6000))))::int;
        WITH p AS (
            INSERT INTO payments (wallet_id, amount)
            SELECT 'wallet-' || (random() * 99)::int,
                   CASE WHEN random() < 0.001 THEN 0 ELSE round((random() * 100)::numeric + 1, 2) END
            FROM generate_series(1, n)
            RETURNING id, wallet_id, amount
        )
        INSERT INTO outbox (aggregate_id, topic, event_type, payload)
        SELECT wallet_id,
               CASE WHEN random() < 0.0005 THEN 'payments.unrouted' ELSE 'payments.events' END,
               'payment.captured',
               jsonb_build_object('payment_id', id, 'amount', amount)
        FROM p;
        COMMIT;
        PERFORM pg_sleep(0.1);
        tick := tick + 1;
    END LOOP;
END
$$;
