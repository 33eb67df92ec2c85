//! `[outbox]`: which tables (and logical messages) become events, and how each is routed and
//! encoded.
//!
//! Two forms are accepted. The shorthand describes one table directly in `[outbox]`:
//! `table`, `topic`, `format`, `[outbox.columns]`, and so on. The general form lists tables as
//! `[[outbox.tables]]` with the same keys. The two forms cannot be mixed. `[outbox.messages]`
//! also takes the same keys, with `prefix` instead of `table`, and maps the JSON content of
//! `pg_logical_emit_message` the way columns are mapped.
//!
//! Defaults follow the seeds' schemas:
//! - key `aggregate_id`;
//! - topic from the `topic` column when the table has one and it is not NULL, else
//!   `outbox.event.${aggregate_type}`;
//! - value `payload` as stored.
//!
//! `compat = "debezium"` makes a route write the records of Debezium's Outbox Event Router
//! (`io.debezium.transforms.outbox.EventRouter`, with Connect's `StringConverter` and its default
//! header converter): the column defaults become the router's (`id`, `aggregateid`,
//! `aggregatetype`, `type`, `payload`), no topic column is read unless `columns.topic` names one,
//! no `event_type` header is added (the router places none unless told to), and a header column
//! that is NULL is sent as a header with a null value instead of being left out, a NULL key
//! column is a null key instead of an invalid row, and with `tombstones` a payload that is
//! blank (empty, or only characters up to U+0020, as Java's `trim` sees it; not bytea) is a
//! tombstone as a NULL one is; without `tombstones` a NULL payload is what the converter makes
//! of null. `[outbox.converters]` names Connect's `JsonConverter` (with or without schemas)
//! for keys or values instead of `StringConverter`, and `expand_json_payload` is the router's
//! `table.expand.json.payload` (`crate::outbox::connect`). walbox's own `walbox.*` headers
//! stay. docs/migrating.md lists what still differs.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::env::{Kind, Setting};
use super::error::ConfigError;
use super::retention::{RawRetention, RetentionConfig};
use crate::dead_letter::Policy;

/// One table (or the message source) as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// `schema.table` or `table` (schema `public`); tables only.
    pub table: Option<String>,
    /// Logical message prefix; `[outbox.messages]` only.
    pub prefix: Option<String>,
    /// Topic template with `${aggregate_type}`, `${aggregate_id}`, `${event_type}`, `${table}`,
    /// `${schema}`.
    pub topic: Option<String>,
    /// Shorthand for `topic = "<prefix>${aggregate_type}"`.
    pub topic_prefix: Option<String>,
    /// Topic when a routing value is NULL.
    pub fallback_topic: Option<String>,
    /// `raw`, `json` (envelope) or `protobuf` (envelope).
    pub format: Option<String>,
    /// Embed a text payload holding JSON as JSON in envelopes.
    pub expand_json_payload: Option<bool>,
    /// Add CloudEvents binary-mode headers.
    pub cloudevents: Option<bool>,
    /// `ce_source`; default `/walbox/<schema>.<table>`.
    pub cloudevents_source: Option<String>,
    /// Send a NULL payload as a tombstone (NULL value) instead of rejecting it.
    pub tombstones: Option<bool>,
    /// `fail` or `dead_letter`.
    pub on_invalid: Option<String>,
    /// Dead-letter topic.
    pub dead_letter_topic: Option<String>,
    /// What an UPDATE/DELETE/TRUNCATE of the table does: `warn`, `fail` or `fail_update`.
    pub on_change: Option<String>,
    /// `walbox` (default) or `debezium`: whose record layout the route writes.
    pub compat: Option<String>,
    /// With `compat = "debezium"` and `expand_json_payload`: `ignore` or `optional_bytes`.
    pub json_payload_null_behavior: Option<String>,
    /// `[.converters]`: the Connect converters whose bytes a `compat = "debezium"` route writes.
    pub converters: Option<RawConverters>,
    /// `[.columns]`.
    #[serde(default)]
    pub columns: RawColumns,
    /// `[.headers]`: column → header name.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `[.envelope]`: column → envelope field name.
    #[serde(default)]
    pub envelope: BTreeMap<String, String>,
}

/// `[outbox.converters]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConverters {
    /// `string` (default) or `json`: the key converter.
    pub key: Option<String>,
    /// `string` (default) or `json`: the value converter.
    pub value: Option<String>,
    /// The key's `JsonConverter` `schemas.enable` (default true).
    pub key_schemas: Option<bool>,
    /// The value's `JsonConverter` `schemas.enable` (default true).
    pub value_schemas: Option<bool>,
}

/// `[outbox.columns]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawColumns {
    /// Event id (header `id`).
    pub id: Option<String>,
    /// Record key.
    pub aggregate_id: Option<String>,
    /// Aggregate type.
    pub aggregate_type: Option<String>,
    /// Event type (header `event_type`).
    pub event_type: Option<String>,
    /// Topic column (overrides the template when not NULL).
    pub topic: Option<String>,
    /// Payload (record value).
    pub payload: Option<String>,
    /// Event timestamp (record timestamp, `ce_time`); default: the commit time.
    pub timestamp: Option<String>,
    /// Explicit partition number.
    pub partition: Option<String>,
}

/// `[outbox]` as written, after the shorthand was normalised into `tables`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutbox {
    /// `[[outbox.tables]]`.
    #[serde(default)]
    pub tables: Vec<RawRoute>,
    /// `[outbox.messages]`.
    pub messages: Option<RawRoute>,
    /// `[outbox.retention]`.
    #[serde(default)]
    pub retention: RawRetention,
}

/// Keys of a route: what the shorthand form may put directly in `[outbox]`.
const ROUTE_KEYS: &[&str] = &[
    "table",
    "topic",
    "topic_prefix",
    "fallback_topic",
    "format",
    "expand_json_payload",
    "cloudevents",
    "cloudevents_source",
    "tombstones",
    "on_invalid",
    "dead_letter_topic",
    "on_change",
    "compat",
    "json_payload_null_behavior",
    "converters",
    "columns",
    "headers",
    "envelope",
];

/// Rewrites the shorthand `[outbox] table = …` into `[[outbox.tables]]`, and adds the default
/// table when neither form names one.
pub fn normalize(root: &mut toml::Table) -> Result<(), ConfigError> {
    let outbox = root
        .entry("outbox")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(outbox) = outbox.as_table_mut() else {
        return Err(ConfigError::Invalid("`outbox` must be a table".into()));
    };
    let mut short = toml::Table::new();
    for key in ROUTE_KEYS {
        if let Some(v) = outbox.remove(*key) {
            short.insert((*key).to_owned(), v);
        }
    }
    match outbox.get("tables") {
        Some(_) if !short.is_empty() => Err(ConfigError::Invalid(
            "use either [outbox] table = … or [[outbox.tables]], not both".into(),
        )),
        Some(_) => Ok(()),
        None if short.is_empty() && outbox.contains_key("messages") => Ok(()),
        None => {
            outbox.insert(
                "tables".into(),
                toml::Value::Array(vec![toml::Value::Table(short)]),
            );
            Ok(())
        }
    }
}

/// How the record value is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueFormat {
    /// The payload bytes as stored.
    Raw,
    /// A JSON envelope: id, type, aggregate, payload, commit LSN, commit time, extra fields.
    Json,
    /// The protobuf envelope `walbox.v1.Envelope` (`proto/walbox/v1/envelope.proto`).
    Protobuf,
}

/// What an UPDATE, DELETE or TRUNCATE of an outbox table does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnChange {
    /// Log a warning (once a minute per table) and ignore it.
    Warn,
    /// Stop: the publication publishes changes an outbox must not.
    Fail,
    /// Stop on an UPDATE; warn about a DELETE or TRUNCATE and ignore it, as Debezium's Outbox
    /// Event Router does with `table.op.invalid.behavior=fatal` (its documented pattern deletes
    /// each row right after inserting it).
    FailOnUpdate,
}

impl OnChange {
    /// Whether `op` (`UPDATE`, `DELETE` or `TRUNCATE`) stops walbox.
    pub fn fails(self, op: &str) -> bool {
        match self {
            OnChange::Warn => false,
            OnChange::Fail => true,
            OnChange::FailOnUpdate => op == "UPDATE",
        }
    }
}

/// Names of the mapped columns (or JSON keys, for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnNames {
    /// Event id.
    pub id: String,
    /// Record key.
    pub aggregate_id: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Event type.
    pub event_type: String,
    /// Column naming the destination topic, if one is read (none with [`Compat::Debezium`]
    /// unless configured).
    pub topic: Option<String>,
    /// Column holding the record value.
    pub payload: String,
    /// Event timestamp, if configured.
    pub timestamp: Option<String>,
    /// Explicit partition, if configured.
    pub partition: Option<String>,
}

/// Whose record layout a route writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compat {
    /// walbox's: the seeds' column names, the `event_type` header, NULL header columns left out.
    Walbox,
    /// Debezium's Outbox Event Router's (see the module docs).
    Debezium,
}

/// A Kafka Connect converter a `compat = "debezium"` route writes the bytes of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Converter {
    /// `org.apache.kafka.connect.storage.StringConverter`.
    String,
    /// `org.apache.kafka.connect.json.JsonConverter`, with its `schemas.enable`.
    Json {
        /// `{"schema":…,"payload":…}` when true; the bare JSON when false.
        schemas: bool,
    },
}

/// The key and value converters of a route (`[outbox.converters]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Converters {
    /// Key converter.
    pub key: Converter,
    /// Value converter.
    pub value: Converter,
}

impl Default for Converters {
    fn default() -> Self {
        Converters {
            key: Converter::String,
            value: Converter::String,
        }
    }
}

/// `json_payload_null_behavior`: what a null in an expanded JSON payload becomes (the router's
/// `table.json.payload.null.behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JsonNulls {
    /// `ignore` (default): the field is left out.
    #[default]
    Ignore,
    /// `optional_bytes`: an optional `bytes` field holding null.
    OptionalBytes,
}

/// Where rows come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteSource {
    /// An outbox table.
    Table {
        /// The table's schema (`public` when the route names none).
        schema: String,
        /// The table's name, without its schema.
        table: String,
    },
    /// Logical messages with this prefix.
    Messages {
        /// The prefix.
        prefix: String,
    },
}

/// One validated route: a source and how its rows become records.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Where rows come from.
    pub source: RouteSource,
    /// `schema.table` or `message:<prefix>`, for messages and headers.
    pub name: Arc<str>,
    /// Column mapping.
    pub columns: ColumnNames,
    /// Topic template.
    pub topic: String,
    /// Topic for NULL routing values.
    pub fallback_topic: Option<String>,
    /// Value encoding.
    pub format: ValueFormat,
    /// Embed JSON text payloads as JSON in envelopes.
    pub expand_json_payload: bool,
    /// CloudEvents headers, with this `ce_source`.
    pub cloudevents_source: Option<String>,
    /// NULL payload → tombstone.
    pub tombstones: bool,
    /// Invalid rows.
    pub on_invalid: Policy,
    /// Non-insert changes.
    pub on_change: OnChange,
    /// Whose record layout.
    pub compat: Compat,
    /// Connect converters (compat = "debezium"; both `String` otherwise).
    pub converters: Converters,
    /// Nulls in expanded JSON payloads (compat = "debezium").
    pub json_nulls: JsonNulls,
    /// Extra columns → header names.
    pub headers: Vec<(String, String)>,
    /// Extra columns → envelope field names.
    pub envelope: Vec<(String, String)>,
}

impl Route {
    /// Whether the route writes Kafka Connect's bytes (`crate::outbox::connect`) rather than
    /// the columns' text: `compat = "debezium"` with a JSON converter, or expanding JSON
    /// payloads.
    pub fn writes_connect_bytes(&self) -> bool {
        self.compat == Compat::Debezium
            && (self.converters != Converters::default() || self.expand_json_payload)
    }
}

/// Validated `[outbox]`.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxConfig {
    /// Table routes, in configuration order.
    pub tables: Vec<Route>,
    /// The logical-message route, if enabled.
    pub messages: Option<Route>,
    /// `[outbox.retention]`, when on.
    pub retention: Option<RetentionConfig>,
}

impl OutboxConfig {
    /// The route of table `schema.table`.
    pub fn table(&self, schema: &str, table: &str) -> Option<&Route> {
        self.tables.iter().find(|r| {
            matches!(&r.source, RouteSource::Table { schema: s, table: t } if s == schema && t == table)
        })
    }
}

fn invalid(msg: String) -> ConfigError {
    ConfigError::Invalid(msg)
}

fn check_name(what: &str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() || s.len() > 63 {
        return Err(invalid(format!("{what} {s:?} must be 1 to 63 characters")));
    }
    Ok(())
}

fn check_topic_template(what: &str, t: &str) -> Result<(), ConfigError> {
    let mut rest = t;
    while let Some(i) = rest.find("${") {
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            return Err(invalid(format!("{what} {t:?}: unclosed ${{")));
        };
        let var = &after[..end];
        if ![
            "aggregate_type",
            "aggregate_id",
            "event_type",
            "table",
            "schema",
        ]
        .contains(&var)
        {
            return Err(invalid(format!(
                "{what} {t:?}: unknown variable ${{{var}}} (use aggregate_type, aggregate_id, event_type, table, schema)"
            )));
        }
        rest = &after[end + 1..];
    }
    if t.is_empty() {
        return Err(invalid(format!("{what} must not be empty")));
    }
    Ok(())
}

impl RawRoute {
    fn validate(self, what: &str, is_messages: bool) -> Result<Route, ConfigError> {
        let source = if is_messages {
            if self.table.is_some() {
                return Err(invalid(format!(
                    "{what}.table: messages have no table; set prefix"
                )));
            }
            if self.on_change.is_some() {
                return Err(invalid(format!("{what}.on_change applies to tables only")));
            }
            let prefix = self.prefix.unwrap_or_else(|| "walbox.outbox".into());
            if prefix.is_empty() {
                return Err(invalid(format!("{what}.prefix must not be empty")));
            }
            RouteSource::Messages { prefix }
        } else {
            if self.prefix.is_some() {
                return Err(invalid(format!(
                    "{what}.prefix applies to [outbox.messages] only"
                )));
            }
            let t = self.table.unwrap_or_else(|| "public.outbox".into());
            let (schema, table) = match t.split_once('.') {
                Some((s, t)) => (s.to_owned(), t.to_owned()),
                None => ("public".to_owned(), t),
            };
            check_name(&format!("{what}.table schema"), &schema)?;
            check_name(&format!("{what}.table"), &table)?;
            RouteSource::Table { schema, table }
        };
        let name: Arc<str> = match &source {
            RouteSource::Table { schema, table } => format!("{schema}.{table}").into(),
            RouteSource::Messages { prefix } => format!("message:{prefix}").into(),
        };
        let compat = match self.compat.as_deref().unwrap_or("walbox") {
            "walbox" => Compat::Walbox,
            "debezium" => Compat::Debezium,
            other => {
                return Err(invalid(format!(
                    "{what}.compat {other:?} must be \"walbox\" or \"debezium\""
                )))
            }
        };
        let debezium = compat == Compat::Debezium;
        let pick = |walbox: &str, router: &str| if debezium { router } else { walbox }.to_owned();
        let c = self.columns;
        let columns = ColumnNames {
            id: c.id.unwrap_or_else(|| "id".into()),
            aggregate_id: c
                .aggregate_id
                .unwrap_or_else(|| pick("aggregate_id", "aggregateid")),
            aggregate_type: c
                .aggregate_type
                .unwrap_or_else(|| pick("aggregate_type", "aggregatetype")),
            event_type: c.event_type.unwrap_or_else(|| pick("event_type", "type")),
            topic: c.topic.or_else(|| (!debezium).then(|| "topic".into())),
            payload: c.payload.unwrap_or_else(|| "payload".into()),
            timestamp: c.timestamp,
            partition: c.partition,
        };
        let topic = match (self.topic, self.topic_prefix) {
            (Some(_), Some(_)) => {
                return Err(invalid(format!(
                    "{what}: set topic or topic_prefix, not both"
                )))
            }
            (Some(t), None) => t,
            (None, Some(p)) => format!("{p}${{aggregate_type}}"),
            (None, None) => "outbox.event.${aggregate_type}".into(),
        };
        check_topic_template(&format!("{what}.topic"), &topic)?;
        if let Some(f) = &self.fallback_topic {
            check_topic_template(&format!("{what}.fallback_topic"), f)?;
        }
        let format = match self.format.as_deref().unwrap_or("raw") {
            "raw" => ValueFormat::Raw,
            "json" => ValueFormat::Json,
            "protobuf" => ValueFormat::Protobuf,
            other => {
                return Err(invalid(format!(
                    "{what}.format {other:?} must be \"raw\", \"json\" or \"protobuf\""
                )))
            }
        };
        let on_invalid = match self.on_invalid.as_deref().unwrap_or("fail") {
            "fail" => {
                if self.dead_letter_topic.is_some() {
                    return Err(invalid(format!(
                        "{what}.dead_letter_topic needs on_invalid = \"dead_letter\""
                    )));
                }
                Policy::Fail
            }
            "dead_letter" => Policy::DeadLetter(
                self.dead_letter_topic
                    .unwrap_or_else(|| "walbox.dead_letter".into()),
            ),
            other => {
                return Err(invalid(format!(
                    "{what}.on_invalid {other:?} must be \"fail\" or \"dead_letter\""
                )))
            }
        };
        let on_change = match self.on_change.as_deref().unwrap_or("warn") {
            "warn" => OnChange::Warn,
            "fail" => OnChange::Fail,
            "fail_update" => OnChange::FailOnUpdate,
            other => {
                return Err(invalid(format!(
                    "{what}.on_change {other:?} must be \"warn\", \"fail\" or \"fail_update\""
                )))
            }
        };
        let cloudevents_source = match (self.cloudevents.unwrap_or(false), self.cloudevents_source)
        {
            (true, Some(s)) => Some(s),
            (true, None) => Some(format!("/walbox/{name}")),
            (false, Some(_)) => {
                return Err(invalid(format!(
                    "{what}.cloudevents_source needs cloudevents = true"
                )))
            }
            (false, None) => None,
        };
        let converter = |name: &str, v: Option<&str>, schemas: Option<bool>| match v {
            None | Some("string") if schemas.is_none() => Ok(Converter::String),
            None | Some("string") => Err(invalid(format!(
                "{what}.converters.{name}_schemas needs converters.{name} = \"json\""
            ))),
            Some("json") => Ok(Converter::Json {
                schemas: schemas.unwrap_or(true),
            }),
            Some(other) => Err(invalid(format!(
                "{what}.converters.{name} {other:?} must be \"string\" or \"json\""
            ))),
        };
        let converters = match &self.converters {
            None => Converters::default(),
            Some(_) if !debezium => {
                return Err(invalid(format!(
                    "{what}.converters needs compat = \"debezium\" (walbox's own layout has no Connect converters)"
                )))
            }
            Some(_) if is_messages => {
                return Err(invalid(format!(
                    "{what}.converters applies to tables only"
                )))
            }
            Some(c) => Converters {
                key: converter("key", c.key.as_deref(), c.key_schemas)?,
                value: converter("value", c.value.as_deref(), c.value_schemas)?,
            },
        };
        let json_nulls = match self.json_payload_null_behavior.as_deref() {
            None => JsonNulls::Ignore,
            Some(_) if !(debezium && self.expand_json_payload == Some(true)) => {
                return Err(invalid(format!(
                    "{what}.json_payload_null_behavior needs compat = \"debezium\" and expand_json_payload = true"
                )))
            }
            Some("ignore") => JsonNulls::Ignore,
            Some("optional_bytes") => JsonNulls::OptionalBytes,
            Some(other) => {
                return Err(invalid(format!(
                    "{what}.json_payload_null_behavior {other:?} must be \"ignore\" or \"optional_bytes\""
                )))
            }
        };
        if debezium && is_messages && self.expand_json_payload == Some(true) {
            return Err(invalid(format!(
                "{what}.expand_json_payload with compat = \"debezium\" applies to tables only (the router expands a payload column)"
            )));
        }
        if debezium && format != ValueFormat::Raw {
            return Err(invalid(format!(
                "{what}.format must be \"raw\" with compat = \"debezium\": the router's records are the payload"
            )));
        }
        if !self.envelope.is_empty() && format == ValueFormat::Raw {
            return Err(invalid(format!(
                "{what}.envelope needs format = \"json\" or \"protobuf\""
            )));
        }
        Ok(Route {
            source,
            name,
            columns,
            topic,
            fallback_topic: self.fallback_topic,
            format,
            expand_json_payload: self.expand_json_payload.unwrap_or(false),
            cloudevents_source,
            tombstones: self.tombstones.unwrap_or(false),
            on_invalid,
            on_change,
            compat,
            converters,
            json_nulls,
            headers: self.headers.into_iter().collect(),
            envelope: self.envelope.into_iter().collect(),
        })
    }
}

/// Kafka Connect's producer's default `max.request.size`: the largest record Debezium relays,
/// and the default `message.max.bytes` of a walbox with a `compat = "debezium"` route.
pub const CONNECT_MAX_REQUEST_SIZE: &str = "1048576";

/// The most outbox tables one walbox relays (each record's delivery report carries its table's
/// index in a few bits).
pub const MAX_OUTBOX_TABLES: usize = 1000;

impl RawOutbox {
    /// The settings of `[outbox]` (the shorthand's one table) and `[outbox.columns]`.
    pub(super) const SETTINGS: &'static [Setting] = &[
        (&["outbox"], "table", Kind::Str),
        (&["outbox"], "topic_prefix", Kind::Str),
        (&["outbox"], "topic", Kind::Str),
        (&["outbox"], "fallback_topic", Kind::Str),
        (&["outbox"], "format", Kind::Str),
        (&["outbox"], "expand_json_payload", Kind::Bool),
        (&["outbox"], "cloudevents", Kind::Bool),
        (&["outbox"], "cloudevents_source", Kind::Str),
        (&["outbox"], "tombstones", Kind::Bool),
        (&["outbox"], "on_invalid", Kind::Str),
        (&["outbox"], "dead_letter_topic", Kind::Str),
        (&["outbox"], "on_change", Kind::Str),
        (&["outbox"], "compat", Kind::Str),
        (&["outbox"], "json_payload_null_behavior", Kind::Str),
        (&["outbox", "converters"], "key", Kind::Str),
        (&["outbox", "converters"], "value", Kind::Str),
        (&["outbox", "converters"], "key_schemas", Kind::Bool),
        (&["outbox", "converters"], "value_schemas", Kind::Bool),
        (&["outbox", "columns"], "id", Kind::Str),
        (&["outbox", "columns"], "aggregate_id", Kind::Str),
        (&["outbox", "columns"], "aggregate_type", Kind::Str),
        (&["outbox", "columns"], "event_type", Kind::Str),
        (&["outbox", "columns"], "topic", Kind::Str),
        (&["outbox", "columns"], "payload", Kind::Str),
        (&["outbox", "columns"], "timestamp", Kind::Str),
        (&["outbox", "columns"], "partition", Kind::Str),
    ];

    /// Validates every route.
    pub fn validate(self) -> Result<OutboxConfig, ConfigError> {
        if self.tables.len() > MAX_OUTBOX_TABLES {
            return Err(invalid(format!(
                "outbox.tables lists {} tables; one walbox relays at most {MAX_OUTBOX_TABLES} (run several, each with its own slot)",
                self.tables.len()
            )));
        }
        let mut tables = Vec::with_capacity(self.tables.len());
        for (i, t) in self.tables.into_iter().enumerate() {
            let what = if i == 0 {
                "outbox".to_owned()
            } else {
                format!("outbox.tables[{i}]")
            };
            let route = t.validate(&what, false)?;
            if tables.iter().any(|r: &Route| r.source == route.source) {
                return Err(invalid(format!(
                    "{what}: table {} is listed twice",
                    route.name
                )));
            }
            tables.push(route);
        }
        let messages = self
            .messages
            .map(|m| m.validate("outbox.messages", true))
            .transpose()?;
        let retention = self.retention.validate()?;
        if let Some(r) = &retention {
            if r.column.is_none() {
                if let Some(route) = tables.iter().find(|t| t.columns.timestamp.is_none()) {
                    return Err(invalid(format!(
                        "[outbox.retention] needs each row's insert time: set outbox.retention.column, or outbox.columns.timestamp for {}",
                        route.name
                    )));
                }
            }
        }
        Ok(OutboxConfig {
            tables,
            messages,
            retention,
        })
    }
}
