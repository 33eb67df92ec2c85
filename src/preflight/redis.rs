//! The Redis checks of `walbox check`, when `[redis]` is the broker: the server answers and
//! takes the credentials, runs Redis 7.0 or later (re-sent entries are confirmed through
//! `XINFO STREAM`'s `max-deleted-entry-id` and `recorded-first-entry-id`), would keep an
//! acknowledged entry across a crash (`appendonly yes`, `appendfsync always`) and never evict a
//! stream (`maxmemory-policy noeviction`), grants `XADD` on every stream the configuration names,
//! and lets walbox write and read its progress records.
//!
//! The connection is opened exactly like the publisher's (`sink::redis::open`). Persistence is
//! read with `CONFIG GET`; a user without it gets a warning saying so, not a failure. `XADD` is
//! probed with id `0-0` and `NOMKSTREAM`, which Redis refuses after the ACL check and before
//! touching the key: "must be greater than 0-0" means permitted, `NOPERM` refused; nothing is
//! written. The progress check writes a scratch key under `redis.progress_key_prefix`
//! (`walbox-check/<pid>`, expiring after a second), reads it back and deletes it.

use redis::aio::MultiplexedConnection;
use redis::Value;

use crate::config::{Config, RedisConfig};
use crate::failure::{Class, Failure};
use crate::outbox::OutboxMapper;
use crate::preflight::Check;
use crate::sink::redis::open;
use crate::sink::redis_reply::text;

const SERVER: &str = "redis server";
const VERSION: &str = "redis version";
const PERSISTENCE: &str = "redis persistence";
const EVICTION: &str = "redis maxmemory-policy";
const PROGRESS: &str = "redis progress key";

fn stream_check(stream: &str) -> String {
    format!("redis stream {stream}")
}

/// Every Redis check, in order (`config.broker` is `[redis]`).
pub async fn checks(config: &Config, redis: &RedisConfig) -> Vec<Check> {
    let streams = OutboxMapper::new(&config.outbox).known_topics();
    let who = redis.user.as_deref().unwrap_or("default");
    let mut conn = match open(redis, redis.timeout).await {
        Ok(c) => c,
        Err(e) => {
            let fix = match e.class {
                Class::Fatal(Failure::Auth) => "set redis.user and redis.password_file to credentials the server accepts (ACL LIST shows its users)",
                _ => "check redis.url names the server's host and port, and that it is up (redis-cli -h <host> -p <port> PING)",
            };
            let mut out = vec![Check::fail(SERVER, e.message, fix)];
            for name in [VERSION, PERSISTENCE, EVICTION]
                .into_iter()
                .map(str::to_owned)
                .chain(streams.iter().map(|s| stream_check(s)))
                .chain([PROGRESS.to_owned()])
            {
                out.push(Check::skipped(name, SERVER));
            }
            return out;
        }
    };
    let mut out = vec![Check::ok(SERVER, format!("answers, as user {who:?}"))];
    out.push(version(&mut conn).await);
    let (persistence, eviction) = persistence(&mut conn).await;
    out.push(persistence);
    out.push(eviction);
    for stream in &streams {
        out.push(xadd_permitted(&mut conn, stream, who).await);
    }
    out.push(progress(&mut conn, redis).await);
    out
}

async fn query(conn: &mut MultiplexedConnection, cmd: &redis::Cmd) -> Result<Value, String> {
    match cmd.query_async::<Value>(conn).await {
        Ok(Value::ServerError(e)) => Err(format!("{} {}", e.code(), e.details().unwrap_or(""))),
        Ok(v) => Ok(v),
        Err(e) => match e.code() {
            Some(code) => Err(format!("{code} {}", e.detail().unwrap_or(""))),
            None => Err(e.to_string()),
        },
    }
}

/// `INFO server`'s `redis_version`: 7.0 or later.
async fn version(conn: &mut MultiplexedConnection) -> Check {
    let info = match query(conn, redis::cmd("INFO").arg("server")).await {
        Ok(v) => text(&v).unwrap_or_default(),
        Err(e) => {
            return Check::fail(
                VERSION,
                format!("INFO server refused: {e}"),
                "grant walbox's user +info",
            )
        }
    };
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    let major: Option<u32> = version.split('.').next().and_then(|m| m.parse().ok());
    match major {
        Some(m) if m >= 7 => Check::ok(VERSION, version),
        Some(_) => Check::fail(
            VERSION,
            format!("{version}: walbox confirms re-sent entries with XINFO STREAM's max-deleted-entry-id, which Redis has from 7.0"),
            "upgrade Redis to 7.0 or later",
        ),
        None => Check::warn(
            VERSION,
            "INFO server names no redis_version (not Redis?)",
            "use Redis 7.0 or later",
        ),
    }
}

/// `CONFIG GET` of one parameter, `None` when refused or absent.
async fn config_get(
    conn: &mut MultiplexedConnection,
    name: &str,
) -> Result<Option<String>, String> {
    let reply = query(conn, redis::cmd("CONFIG").arg("GET").arg(name)).await?;
    let pairs: Vec<&Value> = match &reply {
        Value::Array(items) => items.iter().skip(1).step_by(2).collect(),
        Value::Map(items) => items.iter().map(|(_, v)| v).collect(),
        _ => Vec::new(),
    };
    Ok(pairs.first().and_then(|v| text(v)))
}

/// Whether an acknowledged entry survives a crash, and whether a stream can be evicted.
async fn persistence(conn: &mut MultiplexedConnection) -> (Check, Check) {
    let refused = |e: String| {
        (
            Check::warn(
                PERSISTENCE,
                format!("CONFIG GET is not permitted ({e}): cannot tell whether an acknowledged entry survives a Redis crash"),
                "check appendonly yes and appendfsync always on the server, or grant walbox's user +config|get",
            ),
            Check::warn(
                EVICTION,
                "CONFIG GET is not permitted: cannot tell whether Redis may evict streams",
                "check maxmemory-policy noeviction on the server",
            ),
        )
    };
    let appendonly = match config_get(conn, "appendonly").await {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => return refused(e),
    };
    let fsync = match config_get(conn, "appendfsync").await {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => return refused(e),
    };
    let policy = match config_get(conn, "maxmemory-policy").await {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => return refused(e),
    };
    let persistence = if appendonly == "yes" && fsync == "always" {
        Check::ok(
            PERSISTENCE,
            "appendonly yes, appendfsync always: an acknowledged entry is on disk",
        )
    } else {
        Check::warn(
            PERSISTENCE,
            format!("appendonly {appendonly}, appendfsync {fsync}: walbox counts an entry delivered once Redis has it in memory, and a Redis crash loses what is not on disk (walbox does not send it again)"),
            "CONFIG SET appendonly yes; CONFIG SET appendfsync always (and in redis.conf), or replicate with redis.wait_replicas",
        )
    };
    let eviction = if policy == "noeviction" {
        Check::ok(EVICTION, "noeviction: streams are never evicted")
    } else {
        Check::warn(
            EVICTION,
            format!("{policy}: under memory pressure Redis may evict a whole stream walbox delivered to"),
            "CONFIG SET maxmemory-policy noeviction (and in redis.conf)",
        )
    };
    (persistence, eviction)
}

/// `XADD <stream> NOMKSTREAM 0-0`: refused after the ACL check, before the key is touched.
async fn xadd_permitted(conn: &mut MultiplexedConnection, stream: &str, who: &str) -> Check {
    let probe = redis::cmd("XADD")
        .arg(stream)
        .arg("NOMKSTREAM")
        .arg("0-0")
        .arg("walbox-check")
        .arg("")
        .clone();
    match query(conn, &probe).await {
        Err(e) if e.contains("greater than 0-0") => confirm_permitted(conn, stream, who).await,
        Err(e) if e.starts_with("NOPERM") => Check::fail(
            stream_check(stream),
            format!("XADD refused for user {who:?}: {e}"),
            format!("ACL SETUSER {who} +xadd ~{stream}"),
        ),
        Err(e) => Check::fail(
            stream_check(stream),
            format!("XADD probe failed: {e}"),
            "see the message",
        ),
        Ok(v) => Check::warn(
            stream_check(stream),
            format!("the XADD probe with id 0-0 was not refused ({v:?})"),
            "check the server is Redis 7.0 or later",
        ),
    }
}

/// `XRANGE` and `XINFO STREAM`, which confirm a re-sent entry: read-only probes (`XINFO` of a
/// stream not created yet answers "no such key", after the ACL check).
async fn confirm_permitted(conn: &mut MultiplexedConnection, stream: &str, who: &str) -> Check {
    let probes = [
        (
            "XRANGE",
            redis::cmd("XRANGE")
                .arg(stream)
                .arg("0-0")
                .arg("0-0")
                .clone(),
        ),
        (
            "XINFO STREAM",
            redis::cmd("XINFO").arg("STREAM").arg(stream).clone(),
        ),
    ];
    for (name, probe) in &probes {
        match query(conn, probe).await {
            Err(e) if e.starts_with("NOPERM") => {
                return Check::fail(
                    stream_check(stream),
                    format!("XADD permitted, {name} refused for user {who:?} ({e}): walbox confirms re-sent entries with XRANGE and XINFO STREAM"),
                    format!("ACL SETUSER {who} +xrange +xinfo|stream ~{stream}"),
                )
            }
            Err(e) if !e.contains("no such key") => {
                return Check::fail(stream_check(stream), format!("{name} probe failed: {e}"), "see the message")
            }
            _ => {}
        }
    }
    Check::ok(
        stream_check(stream),
        "XADD, XRANGE and XINFO STREAM permitted",
    )
}

/// Writes, reads back and deletes a scratch key under `progress_key_prefix`.
async fn progress(conn: &mut MultiplexedConnection, redis: &RedisConfig) -> Check {
    let key = format!(
        "{}walbox-check/{}",
        redis.progress_key_prefix,
        std::process::id()
    );
    let fix = format!(
        "ACL SETUSER {} +set +get +del ~{}*",
        redis.user.as_deref().unwrap_or("default"),
        redis.progress_key_prefix
    );
    let steps = [
        redis::cmd("SET")
            .arg(&key)
            .arg("{}")
            .arg("PX")
            .arg(1000)
            .clone(),
        redis::cmd("GET").arg(&key).clone(),
        redis::cmd("DEL").arg(&key).clone(),
    ];
    for step in &steps {
        if let Err(e) = query(conn, step).await {
            return Check::fail(PROGRESS, format!("{key:?}: {e}"), fix);
        }
    }
    Check::ok(
        PROGRESS,
        format!(
            "progress records are kept at \"{}<slot key>\": written and read back",
            redis.progress_key_prefix
        ),
    )
}
