//! A Debezium PostgreSQL connector's settings → a walbox configuration document
//! ([`translate`]): the connection, the slot and publication it reads, the outbox tables
//! (`table.include.list`), the Outbox Event Router's settings (`router.rs`) in
//! `compat = "debezium"`, the connector's converters, its producer overrides, its heartbeat.
//!
//! Invariants:
//! - Every setting is taken by exactly one rule: mapped, accepted as having no effect on the
//!   records (with a note when the operator should know), or refused with its reason. A setting
//!   no rule knows is refused: nothing is dropped silently.
//! - Secrets are never copied: `database.password` becomes `postgres.password_file` (the file a
//!   `${directory:…}` config provider names, else [`PASSWORD_FILE`]), a SASL password in
//!   `sasl.jaas.config` becomes `kafka.property_files."sasl.password"`, and any other secret
//!   setting is refused by name.
//! - The slot and publication are Debezium's own (`slot.name`, `publication.name`, with their
//!   defaults): walbox resumes where the connector confirmed (docs/migrating.md), so the
//!   document never asks walbox to create either.

use std::path::Path;

use toml::{Table, Value};

use super::connector::{is_secret, ConnectorConfig};
use super::error::DebeziumError;
use super::router::{event_router, EVENT_ROUTER};
use super::settings::{Finding, Settings};
use crate::config::conninfo::ConnInfo;

/// Debezium's PostgreSQL connector class.
pub const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
/// Where the printed configuration reads the PostgreSQL password from, unless the connector
/// names a file through a `${directory:…}` config provider.
pub const PASSWORD_FILE: &str = "/run/secrets/walbox/postgres-password";
/// Where it reads a SASL password from.
pub const KAFKA_PASSWORD_FILE: &str = "/run/secrets/walbox/kafka-password";

const STRING_CONVERTER: &str = "org.apache.kafka.connect.storage.StringConverter";
const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";
const HEADER_CONVERTER: &str = "org.apache.kafka.connect.storage.SimpleHeaderConverter";
/// Debezium's converter that writes `BYTES` values (a bytea payload) as they are, and hands
/// any other value to its `delegate.converter.type`.
const BINARY_DATA_CONVERTER: &str = "io.debezium.converters.BinaryDataConverter";

/// Settings that tune Debezium's own pipeline or its value conversions: they change nothing
/// walbox writes for an outbox of text, JSON and integer columns.
const NO_EFFECT: &[&str] = &[
    "database.tcpKeepAlive",
    "decimal.handling.mode",
    "errors.max.retries",
    "errors.retry.delay.initial.ms",
    "errors.retry.delay.max.ms",
    "heartbeat.topics.prefix",
    "hstore.handling.mode",
    "include.unknown.datatypes",
    "interval.handling.mode",
    "max.batch.size",
    "max.queue.size",
    "max.queue.size.in.bytes",
    "money.fraction.digits",
    "poll.interval.ms",
    "retriable.restart.connector.wait.ms",
    "schema.name.adjustment.mode",
    "field.name.adjustment.mode",
    "status.update.interval.ms",
    "time.precision.mode",
    "topic.heartbeat.prefix",
    "topic.naming.strategy",
    "xmin.fetch.interval.ms",
];

/// The translation: the document, and the findings about it.
#[derive(Debug)]
pub struct Translation {
    /// The connector's name, when it has one.
    pub name: Option<String>,
    /// The walbox configuration, section by section in print order.
    pub document: Table,
    /// Settings walbox cannot honour.
    pub unhonoured: Vec<Finding>,
    /// What the operator must do for honoured settings.
    pub notes: Vec<Finding>,
}

/// Translates a connector configuration; see the module docs.
pub fn translate(connector: &ConnectorConfig) -> Result<Translation, DebeziumError> {
    let mut s = Settings::new(connector.settings.clone());
    s.take("name");
    match s.take("connector.class") {
        None => return Err(DebeziumError::Missing("connector.class")),
        Some(class) if class.trim() == POSTGRES_CONNECTOR => {}
        Some(class) => return Err(DebeziumError::NotPostgres(class)),
    }
    let mut document = Table::new();
    document.insert("postgres".into(), Value::Table(postgres(&mut s)?));
    document.insert("outbox".into(), Value::Table(outbox(&mut s)?));
    let kafka = kafka(&mut s);
    if !kafka.is_empty() {
        document.insert("kafka".into(), Value::Table(kafka));
    }
    if let Some(slot) = heartbeat(&mut s)? {
        document.insert("slot".into(), Value::Table(slot));
    }
    leftovers(&mut s);
    Ok(Translation {
        name: connector.name.clone(),
        document,
        unhonoured: s.unhonoured,
        notes: s.notes,
    })
}

/// A required setting that is no config-provider reference.
fn required(s: &mut Settings, key: &'static str) -> Result<String, DebeziumError> {
    let value = s
        .take(key)
        .filter(|v| !v.trim().is_empty())
        .ok_or(DebeziumError::Missing(key))?;
    plain(key, value)
}

/// A value walbox can use as it is: not a `${provider:…}` reference Connect would resolve.
fn plain(key: &str, value: String) -> Result<String, DebeziumError> {
    if value.contains("${") {
        return Err(DebeziumError::Invalid {
            key: key.to_owned(),
            reason: "is a Connect config provider reference: give the connector's resolved \
                     value in the configuration passed to from-debezium"
                .into(),
        });
    }
    Ok(value)
}

/// libpq's key=value quoting.
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `[postgres]`: the connection, the password as a file, Debezium's slot and publication.
fn postgres(s: &mut Settings) -> Result<Table, DebeziumError> {
    let host = required(s, "database.hostname")?;
    let user = required(s, "database.user")?;
    let dbname = required(s, "database.dbname")?;
    let mut conninfo = format!(
        "host={} user={} dbname={}",
        quoted(&host),
        quoted(&user),
        quoted(&dbname)
    );
    for (key, param) in [
        ("database.port", "port"),
        ("database.sslmode", "sslmode"),
        ("database.sslrootcert", "sslrootcert"),
    ] {
        if let Some(v) = s.take(key) {
            let v = plain(key, v)?;
            conninfo.push_str(&format!(" {param}={}", quoted(&v)));
        }
    }
    let conn: ConnInfo = conninfo.parse().map_err(|e| DebeziumError::Invalid {
        key: "database.*".into(),
        reason: format!("the connection it describes is invalid: {e}"),
    })?;
    let mut table = Table::new();
    table.insert("url".into(), Value::String(conn.redacted()));
    if let Some(password) = s.take("database.password") {
        let file = match directory_provider(&password) {
            Some(file) => file,
            None => {
                s.note(
                    "database.password",
                    format!(
                        "not copied: write the password into {PASSWORD_FILE} (readable by walbox \
                         only), or set postgres.password_file to the file holding it"
                    ),
                );
                PASSWORD_FILE.to_owned()
            }
        };
        table.insert("password_file".into(), Value::String(file));
    }
    for key in [
        "database.sslcert",
        "database.sslkey",
        "database.sslpassword",
    ] {
        if s.take(key).is_some() {
            s.refuse(
                key,
                "walbox authenticates to PostgreSQL with a password, not a client certificate",
            );
        }
    }
    match s.take("plugin.name").as_deref().map(str::trim) {
        Some("pgoutput") => {}
        other => s.refuse(
            "plugin.name",
            format!(
                "is {}: walbox decodes pgoutput only, so it cannot resume on this slot; give \
                 walbox a slot of its own (docs/migrating.md)",
                other.unwrap_or("not set (Debezium's default, decoderbufs)")
            ),
        ),
    }
    let slot = s.take("slot.name").unwrap_or_else(|| "debezium".into());
    let publication = s
        .take("publication.name")
        .unwrap_or_else(|| "dbz_publication".into());
    table.insert("slot".into(), Value::String(plain("slot.name", slot)?));
    table.insert(
        "publication".into(),
        Value::String(plain("publication.name", publication)?),
    );
    match s.take("publication.autocreate.mode").as_deref() {
        Some("filtered") | Some("disabled") | Some("no_tables") => {}
        _ => s.note(
            "publication.autocreate.mode",
            "all_tables (Debezium's default) made the publication FOR ALL TABLES: walbox decodes \
             every table's changes and relays only the outbox's, and walbox check flags it",
        ),
    }
    match s.take("slot.drop.on.stop").as_deref().map(str::trim) {
        None | Some("false") => {}
        Some(_) => s.refuse(
            "slot.drop.on.stop",
            "stopping the connector would drop the slot walbox resumes from: set it to false \
             and restart the connector before the switch; walbox never drops its slot",
        ),
    }
    match s.take("snapshot.mode").as_deref().map(str::trim) {
        None => s.note(
            "snapshot.mode",
            "not set (Debezium's default, initial): walbox takes no snapshot; it relays what \
             commits after the slot's position (walbox republish publishes older rows)",
        ),
        Some("no_data") | Some("never") => {}
        Some(other) => s.note(
            "snapshot.mode",
            format!(
                "is {other}: walbox takes no snapshot; it relays what commits after the slot's \
                 position (walbox republish publishes older rows)"
            ),
        ),
    }
    Ok(table)
}

/// The file a `${directory:<dir>:<file>}` reference (Kafka's `DirectoryConfigProvider`) reads.
fn directory_provider(value: &str) -> Option<String> {
    let inner = value
        .trim()
        .strip_prefix("${directory:")?
        .strip_suffix('}')?;
    let (dir, file) = inner.rsplit_once(':')?;
    (!dir.is_empty() && !file.is_empty() && !file.contains('/'))
        .then(|| Path::new(dir).join(file).display().to_string())
}

/// The tables of `table.include.list`: `schema.table` names (`\.` taken as a dot), no regular
/// expressions.
fn tables(s: &mut Settings) -> Vec<String> {
    let schemas = s.take("schema.include.list");
    let Some(list) = s.take("table.include.list") else {
        s.refuse(
            "table.include.list",
            "not set: Debezium captures every table, walbox relays named outbox tables; name \
             them in table.include.list",
        );
        if schemas.is_some() {
            s.refuse("schema.include.list", "walbox relays tables, not schemas");
        }
        return Vec::new();
    };
    let mut tables = Vec::new();
    for (n, entry) in list.split(',').map(str::trim).enumerate() {
        let name = entry.replace("\\.", ".");
        let parts: Vec<&str> = name.split('.').collect();
        let plain = parts.len() == 2
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'));
        if plain {
            tables.push(name);
        } else {
            s.refuse(
                format!("table.include.list (entry {})", n + 1),
                "is not a schema.table name: walbox relays tables named exactly, not regular \
                 expressions",
            );
        }
    }
    tables
}

/// `[outbox]`: the tables, each with the router's route.
fn outbox(s: &mut Settings) -> Result<Table, DebeziumError> {
    let tables = tables(s);
    let mut route = Table::new();
    route.insert("compat".into(), Value::String("debezium".into()));
    let transforms: Vec<String> = s
        .take("transforms")
        .unwrap_or_default()
        .split(',')
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect();
    let mut routers = 0;
    for name in &transforms {
        let class = s
            .take(&format!("transforms.{name}.type"))
            .unwrap_or_default();
        if class.trim() == EVENT_ROUTER && routers == 0 {
            routers += 1;
            event_router(s, name, &mut route);
        } else {
            s.take_prefixed(&format!("transforms.{name}."));
            s.refuse(
                format!("transforms.{name}"),
                format!(
                    "{}: walbox applies the Outbox Event Router only, once",
                    if class.is_empty() {
                        "no type"
                    } else {
                        class.trim()
                    }
                ),
            );
        }
    }
    if routers == 0 {
        return Err(DebeziumError::Invalid {
            key: "transforms".into(),
            reason: format!(
                "no {EVENT_ROUTER}: walbox relays outbox events, not Debezium's change events"
            ),
        });
    }
    converters(s, &mut route);
    let mut outbox = Table::new();
    match tables.as_slice() {
        [] => outbox.extend(route),
        [one] => {
            outbox.insert("table".into(), Value::String(one.clone()));
            outbox.extend(route);
        }
        several => {
            let list = several
                .iter()
                .map(|t| {
                    let mut r = Table::new();
                    r.insert("table".into(), Value::String(t.clone()));
                    r.extend(route.clone());
                    Value::Table(r)
                })
                .collect();
            outbox.insert("tables".into(), Value::Array(list));
        }
    }
    s.take("tombstones.on.delete");
    s.take("topic.prefix");
    s.take("tasks.max");
    s.take("database.server.name");
    Ok(outbox)
}

/// `key.converter`, `value.converter`, `header.converter`: walbox writes what Connect's
/// `StringConverter` and `JsonConverter` write for keys and values (`[outbox.converters]`,
/// `schemas.enable` included), what `SimpleHeaderConverter` writes for headers, and, for
/// values, what Debezium's `BinaryDataConverter` writes with a `StringConverter` delegate (a
/// bytea payload's bytes, any other payload's text).
fn converters(s: &mut Settings, route: &mut Table) {
    let mut unset = Vec::new();
    let mut table = Table::new();
    for (key, short) in [
        ("key.converter", Some("key")),
        ("value.converter", Some("value")),
        ("header.converter", None),
    ] {
        let class = s.take(key);
        let class = class.as_deref().map(str::trim);
        let binary = key == "value.converter" && class == Some(BINARY_DATA_CONVERTER);
        let json = short.is_some() && class == Some(JSON_CONVERTER);
        let expected = if short.is_some() {
            STRING_CONVERTER
        } else {
            HEADER_CONVERTER
        };
        let ok = match class {
            None => {
                unset.push(key);
                true
            }
            Some(c) if c == expected || binary || json => true,
            Some(c) => {
                let walbox = if short.is_some() {
                    "StringConverter or JsonConverter"
                } else {
                    "SimpleHeaderConverter"
                };
                s.refuse(
                    key,
                    format!("is {c}: walbox writes the bytes {walbox} writes"),
                );
                false
            }
        };
        if let (true, Some(short)) = (json, short) {
            table.insert(short.into(), Value::String("json".into()));
        }
        let mut delegate = false;
        for (rest, value) in s.take_prefixed(&format!("{key}.")) {
            let setting = format!("{key}.{rest}");
            match rest.as_str() {
                "delegate.converter.type" if binary => match value.trim() {
                    STRING_CONVERTER => delegate = true,
                    other => s.refuse(
                        setting,
                        format!(
                            "is {other}: walbox writes a payload that is not bytea as \
                             StringConverter does"
                        ),
                    ),
                },
                "schemas.enable" if json => match value.trim() {
                    "true" => {}
                    "false" => {
                        table.insert(
                            format!("{}_schemas", short.unwrap_or_default()),
                            Value::Boolean(false),
                        );
                    }
                    _ => s.refuse(setting, "must be true or false"),
                },
                // StringConverter has no schemas; JsonConverter's other settings change
                // nothing walbox writes for an outbox record, or are refused.
                "schemas.enable" => {}
                "schemas.cache.size" if json => {}
                "decimal.format" | "replace.null.with.default" if json => {}
                _ if ok => s.refuse(setting, "walbox has no such converter setting"),
                _ => {}
            }
        }
        if binary && !delegate {
            s.note(
                format!("{key}.delegate.converter.type"),
                "not set: Debezium's task fails on a payload that is not bytea; walbox writes its \
                 text, as a StringConverter delegate would",
            );
        }
    }
    if !table.is_empty() {
        route.insert("converters".into(), Value::Table(table));
    }
    if !unset.is_empty() {
        s.note(
            unset.join(", "),
            "not set for the connector, so the worker's apply: walbox writes what \
             StringConverter (keys, values) and SimpleHeaderConverter (headers) write; if the \
             worker uses JsonConverter (the Debezium container image's default, with schemas), \
             add [outbox.converters] key = \"json\" and value = \"json\"",
        );
    }
    if route.get("expand_json_payload") == Some(&Value::Boolean(true)) {
        if let Some(mode) = s.take("field.name.adjustment.mode") {
            if mode.trim() != "none" {
                s.refuse(
                    "field.name.adjustment.mode",
                    "renames the fields of expanded JSON payloads, which walbox does not: set \
                     it to none",
                );
            }
        }
    }
}

/// `producer.override.*`: the brokers, the security protocol and SASL (its password as a file),
/// the producer settings librdkafka has too; and Connect's record size limit.
fn kafka(s: &mut Settings) -> Table {
    let mut kafka = Table::new();
    let mut properties = Table::new();
    for (rest, value) in s.take_prefixed("producer.override.") {
        let key = format!("producer.override.{rest}");
        match rest.as_str() {
            "bootstrap.servers" => {
                kafka.insert("brokers".into(), Value::String(value));
            }
            "security.protocol" => {
                properties.insert(rest, Value::String(value));
            }
            "sasl.mechanism" => {
                properties.insert("sasl.mechanisms".into(), Value::String(value));
            }
            "sasl.jaas.config" => match jaas_username(&value) {
                Some(user) => {
                    properties.insert("sasl.username".into(), Value::String(user));
                    let mut files = Table::new();
                    files.insert(
                        "sasl.password".into(),
                        Value::String(KAFKA_PASSWORD_FILE.into()),
                    );
                    kafka.insert("property_files".into(), Value::Table(files));
                    s.note(
                        key,
                        format!("the password is not copied: write it into {KAFKA_PASSWORD_FILE}"),
                    );
                }
                None => s.refuse(
                    key,
                    "not a PLAIN or SCRAM login with a username: set walbox's SASL properties \
                     by hand (docs/configuration.md, \"Kafka security\")",
                ),
            },
            "max.request.size" => {
                properties.insert("message.max.bytes".into(), Value::String(value));
            }
            // The same names and values in librdkafka.
            "compression.type"
            | "linger.ms"
            | "batch.size"
            | "client.id"
            | "request.timeout.ms"
            | "delivery.timeout.ms"
            | "retries"
            | "retry.backoff.ms"
            | "max.in.flight.requests.per.connection" => {
                properties.insert(rest, Value::String(value));
            }
            "acks" if matches!(value.trim(), "all" | "-1") => {}
            "enable.idempotence" if value.trim() == "true" => {}
            "acks" | "enable.idempotence" => s.refuse(
                key,
                "walbox always produces with acks=all and idempotence: it relays no event it \
                 could lose or reorder",
            ),
            r if r.starts_with("ssl.") => s.refuse(
                key,
                "librdkafka reads PEM files, not Java key stores: set ssl.ca.location (and \
                 ssl.certificate.location, ssl.key.location) by hand",
            ),
            _ if is_secret(&rest) => s.refuse(key, "a secret walbox does not copy"),
            _ => s.refuse(
                key,
                "no walbox equivalent (walbox's producer settings: docs/configuration.md)",
            ),
        }
    }
    // Connect's producer takes a record up to max.request.size (1,048,576 bytes unless
    // overridden); librdkafka's own limit is 1,000,000.
    if !properties.contains_key("message.max.bytes") {
        properties.insert(
            "message.max.bytes".into(),
            Value::String(crate::config::outbox::CONNECT_MAX_REQUEST_SIZE.into()),
        );
        s.note(
            "max.request.size",
            "Connect's producer default (1048576 bytes) is kafka.properties.\"message.max.bytes\": \
             if the worker sets producer.max.request.size, use its value",
        );
    }
    kafka.insert("properties".into(), Value::Table(properties));
    if !kafka.contains_key("brokers") {
        s.note(
            "bootstrap.servers",
            "in Connect's worker configuration, not the connector's: set kafka.brokers (or \
             WALBOX_KAFKA_BROKERS) to the same brokers",
        );
    }
    kafka
}

/// The username of a `PlainLoginModule` or `ScramLoginModule` JAAS line.
fn jaas_username(jaas: &str) -> Option<String> {
    if !(jaas.contains("PlainLoginModule") || jaas.contains("ScramLoginModule")) {
        return None;
    }
    let start = jaas.find("username=\"")? + "username=\"".len();
    let len = jaas[start..].find('"')?;
    Some(jaas[start..start + len].to_owned()).filter(|u| !u.is_empty())
}

/// `heartbeat.interval.ms` → `[slot] heartbeat_interval`.
fn heartbeat(s: &mut Settings) -> Result<Option<Table>, DebeziumError> {
    if s.take("heartbeat.action.query").is_some() {
        s.note(
            "heartbeat.action.query",
            "walbox's heartbeat is a transactional logical message: the heartbeat table is no \
             longer written",
        );
    }
    let Some(ms) = s.take("heartbeat.interval.ms") else {
        return Ok(None);
    };
    let ms: u64 = ms.trim().parse().map_err(|_| DebeziumError::Invalid {
        key: "heartbeat.interval.ms".into(),
        reason: "is not a whole number of milliseconds".into(),
    })?;
    if ms == 0 {
        return Ok(None);
    }
    let mut slot = Table::new();
    slot.insert(
        "heartbeat_interval".into(),
        Value::String(format!("{ms}ms")),
    );
    Ok(Some(slot))
}

/// Settings no rule took: known to have no effect (a note), else refused.
fn leftovers(s: &mut Settings) {
    let mut tuning = Vec::new();
    for key in s.left() {
        let value = s.take(&key).unwrap_or_default();
        if NO_EFFECT.contains(&key.as_str()) {
            tuning.push(key);
            continue;
        }
        match key.as_str() {
            "binary.handling.mode" if value.trim() == "bytes" => {}
            "binary.handling.mode" => s.refuse(
                key,
                "walbox sends a bytea payload as its bytes (Debezium's bytes mode): set bytes, or \
                 remove it if the outbox has no bytea column",
            ),
            "errors.tolerance" if value.trim() == "none" => {}
            "errors.tolerance" => s.refuse(
                key,
                "walbox never skips a record silently: a row it cannot publish stops it, or goes \
                 to a dead-letter topic (on_invalid = \"dead_letter\")",
            ),
            "message.prefix.include.list" => s.refuse(
                key,
                "logical messages: map them with [outbox.messages] by hand (docs/configuration.md)",
            ),
            k if k.starts_with("topic.creation.") => s.note(
                key,
                "walbox creates no topics unless kafka.create_topics = true; the router's topics \
                 exist already",
            ),
            k if is_secret(k) => s.refuse(key, "a secret walbox does not copy"),
            _ => s.refuse(key, "no walbox equivalent"),
        }
    }
    if !tuning.is_empty() {
        s.note(
            tuning.join(", "),
            "tune Debezium's own pipeline or its conversion of non-text columns; walbox needs \
             no equivalent",
        );
    }
}
