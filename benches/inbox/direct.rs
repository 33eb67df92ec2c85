//! The reference of the inbox bench: the transactions `walbox inbox` would run, issued
//! directly by the bench (the inbox statement walbox prepares, written out, and the effect).

use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::{Form, Rec};

/// The inbox statement walbox prepares (see `inbox::store`), written out.
pub(crate) fn insert_sql(form: Form) -> &'static str {
    match form {
        Form::Effect | Form::Set => {
            "INSERT INTO inbox (consumer, message_id) \
             SELECT $1, u.id FROM unnest($2::text[]) WITH ORDINALITY AS u(id, n) ORDER BY u.n \
             ON CONFLICT DO NOTHING RETURNING message_id"
        }
        Form::Stored => {
            "INSERT INTO inbox (consumer, message_id, topic, kafka_partition, kafka_offset, message_key, headers, payload) \
             SELECT $1, u.id, $3, $4, u.off, u.key, u.headers::jsonb, u.payload::jsonb \
             FROM unnest($2::text[], $5::int8[], $6::text[], $7::text[], $8::text[]) \
             WITH ORDINALITY AS u(id, off, key, headers, payload, n) ORDER BY u.n \
             ON CONFLICT DO NOTHING RETURNING message_id"
        }
    }
}

pub(crate) async fn direct_batch(
    c: &mut Client,
    insert: &tokio_postgres::Statement,
    effect: &tokio_postgres::Statement,
    chunk: &[&Rec],
    form: Form,
) -> anyhow::Result<()> {
    let tx = c.transaction().await?;
    let ids: Vec<&str> = chunk.iter().map(|r| r.id.as_str()).collect();
    let consumer = "bench";
    match form {
        Form::Effect | Form::Set => {
            let rows = tx.query(insert, &[&consumer, &ids]).await?;
            let new: std::collections::HashSet<String> =
                rows.iter().map(|r| r.get::<_, String>(0)).collect();
            let params: Vec<[&(dyn ToSql + Sync); 2]> = chunk
                .iter()
                .filter(|r| new.contains(&r.id))
                .map(|r| [&r.payload as &(dyn ToSql + Sync), &r.key])
                .collect();
            let pending = params.iter().map(|p| tx.execute(effect, p));
            for r in futures_util::future::join_all(pending).await {
                r?;
            }
        }
        Form::Stored => {
            let offsets: Vec<i64> = chunk.iter().map(|r| r.offset).collect();
            let keys: Vec<&str> = chunk.iter().map(|r| r.key.as_str()).collect();
            let headers: Vec<&str> = chunk.iter().map(|r| r.headers.as_str()).collect();
            let payloads: Vec<&str> = chunk.iter().map(|r| r.payload.as_str()).collect();
            tx.query(
                insert,
                &[
                    &consumer, &ids, &"topic", &0i32, &offsets, &keys, &headers, &payloads,
                ],
            )
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}
