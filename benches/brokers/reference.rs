//! The plain clients: the messages walbox stored, published again from memory with the crate
//! walbox uses and the acknowledgement walbox waits for, timed from the first publish to the
//! last acknowledgement (the connection is opened before the clock starts).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use anyhow::{bail, Context};
use async_nats::jetstream::message::PublishMessage;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::Confirmation;

use crate::servers::{Message, Mode, Server, EXCHANGE};

/// Commands per Redis pipeline, as walbox's `BATCH`.
const REDIS_BATCH: usize = 1_000;
/// RabbitMQ confirms outstanding at most; NATS PubAcks in [`Mode::Window`].
const WINDOW: usize = 10_000;

/// Publishes `messages` to `server`; returns the seconds from the first publish to the last ack.
pub async fn publish(server: &Server, messages: &[Message], mode: Mode) -> anyhow::Result<f64> {
    match server.kind {
        crate::servers::Kind::Redis => redis(server, messages).await,
        crate::servers::Kind::Nats => nats(server, messages, mode).await,
        crate::servers::Kind::RabbitMq => rabbit(server, messages).await,
    }
}

/// Pipelines of [`REDIS_BATCH`] `XADD`s on one connection, one pipeline at a time.
async fn redis(server: &Server, messages: &[Message]) -> anyhow::Result<f64> {
    let mut conn = server.redis().await?;
    let t0 = Instant::now();
    for batch in messages.chunks(REDIS_BATCH) {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for m in batch {
            let Message::Redis { stream, id, fields } = m else {
                bail!("not a Redis message");
            };
            let cmd = pipe.cmd("XADD").arg(stream).arg(id);
            for f in fields {
                cmd.arg(&f[..]);
            }
        }
        let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        if let Some(e) = replies
            .iter()
            .find(|v| matches!(v, redis::Value::ServerError(_)))
        {
            bail!("XADD refused: {e:?}");
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// JetStream publishes with their PubAcks awaited: one waiting per subject
/// ([`Mode::AsWalbox`]), or up to [`WINDOW`] on any subjects ([`Mode::Window`]).
async fn nats(server: &Server, messages: &[Message], mode: Mode) -> anyhow::Result<f64> {
    let js = server.jetstream().await?;
    let send = |i: usize| {
        let js = js.clone();
        let Message::Nats {
            subject,
            headers,
            payload,
        } = &messages[i]
        else {
            unreachable!("NATS messages only")
        };
        let (subject, message) = (
            subject.clone(),
            PublishMessage::build()
                .payload(payload.clone())
                .headers(headers.clone()),
        );
        async move {
            let ack = js.send_publish(subject, message).await?.await?;
            if ack.duplicate {
                bail!("a duplicate PubAck: the stream was not emptied");
            }
            Ok::<usize, anyhow::Error>(i)
        }
    };
    if !messages.iter().all(|m| matches!(m, Message::Nats { .. })) {
        bail!("not NATS messages");
    }
    let mut flying = FuturesUnordered::new();
    let t0 = Instant::now();
    match mode {
        Mode::Window => {
            for i in 0..messages.len() {
                if flying.len() >= WINDOW {
                    flying.next().await.context("a publish")??;
                }
                flying.push(send(i));
            }
            while let Some(done) = flying.next().await {
                done?;
            }
        }
        Mode::AsWalbox => {
            // A FIFO per subject, in commit order; the head of each is in flight.
            let mut lanes: HashMap<&str, VecDeque<usize>> = HashMap::new();
            let mut order = Vec::new();
            for (i, m) in messages.iter().enumerate() {
                let Message::Nats { subject, .. } = m else {
                    unreachable!()
                };
                lanes
                    .entry(subject.as_str())
                    .or_insert_with(|| {
                        order.push(i);
                        VecDeque::new()
                    })
                    .push_back(i);
            }
            for (_, lane) in lanes.iter_mut() {
                lane.pop_front();
            }
            for i in order {
                flying.push(send(i));
            }
            while let Some(done) = flying.next().await {
                let i = done?;
                let Message::Nats { subject, .. } = &messages[i] else {
                    unreachable!()
                };
                if let Some(next) = lanes
                    .get_mut(subject.as_str())
                    .and_then(VecDeque::pop_front)
                {
                    flying.push(send(next));
                }
            }
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// `mandatory` publishes on one channel in confirm mode, up to [`WINDOW`] confirms
/// outstanding.
async fn rabbit(server: &Server, messages: &[Message]) -> anyhow::Result<f64> {
    let (conn, ch) = server.rabbit().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut pending = VecDeque::with_capacity(WINDOW);
    let check = |c: Confirmation| match c {
        Confirmation::Ack(None) => Ok(()),
        other => Err(anyhow::anyhow!("not confirmed: {other:?}")),
    };
    let t0 = Instant::now();
    for m in messages {
        let Message::Rabbit {
            routing_key,
            properties,
            body,
        } = m
        else {
            bail!("not a RabbitMQ message");
        };
        if pending.len() >= WINDOW {
            let confirm = pending.pop_front().context("a confirm")?;
            check(confirm.await?)?;
        }
        let confirm = ch
            .basic_publish(
                EXCHANGE.into(),
                routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                body,
                (**properties).clone(),
            )
            .await?;
        pending.push_back(confirm);
    }
    while let Some(confirm) = pending.pop_front() {
        check(confirm.await?)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    conn.close(200, "published".into()).await?;
    Ok(secs)
}
