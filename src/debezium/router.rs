//! The Outbox Event Router's settings (`transforms.<name>.*` of an
//! `io.debezium.transforms.outbox.EventRouter`) as a walbox route in `compat = "debezium"`:
//! field names become `[outbox.columns]`, header placements `[outbox.headers]`, the topic
//! replacement the `topic` template, and so on. The router's defaults are the compatibility
//! mode's, so a setting left at its default needs no key.
//!
//! Invariants: every `transforms.<name>.*` setting is taken here, mapped or refused with its
//! reason; none is skipped silently.

use toml::{Table, Value};

use super::settings::Settings;

/// The router's class.
pub const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";

/// The router's default `route.topic.regex`.
const DEFAULT_REGEX: &str = "(?<routedByValue>.*)";

/// Table of `key` in `route`, created when missing.
fn subtable<'a>(route: &'a mut Table, key: &str) -> &'a mut Table {
    route
        .entry(key)
        .or_insert_with(|| Value::Table(Table::new()))
        .as_table_mut()
        .expect("a table")
}

/// Takes every setting of the router named `name` and writes its walbox equivalent into
/// `route` (one `[outbox]` table entry).
pub fn event_router(s: &mut Settings, name: &str, route: &mut Table) {
    let prefix = format!("transforms.{name}.");
    for (rest, value) in s.take_prefixed(&prefix) {
        let key = format!("{prefix}{rest}");
        let column = |route: &mut Table, walbox: &str| {
            subtable(route, "columns").insert(walbox.to_owned(), Value::String(value.clone()));
        };
        match rest.as_str() {
            "type" => {}
            "table.field.event.id" => column(route, "id"),
            "table.field.event.key" => column(route, "aggregate_id"),
            "table.field.event.type" => column(route, "event_type"),
            "table.field.event.payload" => column(route, "payload"),
            "table.field.event.timestamp" => column(route, "timestamp"),
            "route.by.field" => column(route, "aggregate_type"),
            "route.topic.regex" if value == DEFAULT_REGEX => {}
            "route.topic.regex" => s.refuse(
                key,
                "walbox routes by a template, not a regular expression: derive the routing value \
                 in SQL (a generated column) and name it in route.by.field",
            ),
            "route.topic.replacement" => {
                let topic = value.replace("${routedByValue}", "${aggregate_type}");
                if topic.replace("${aggregate_type}", "").contains('$') {
                    s.refuse(
                        key,
                        "refers to a group of route.topic.regex other than ${routedByValue}",
                    );
                } else {
                    route.insert("topic".into(), Value::String(topic));
                }
            }
            "route.tombstone.on.empty.payload" => match value.trim() {
                "true" => {
                    route.insert("tombstones".into(), Value::Boolean(true));
                }
                "false" => {}
                _ => s.refuse(key, "must be true or false"),
            },
            "table.fields.additional.placement" => placements(s, &key, &value, route),
            "table.field.additional.missing" => match value.trim() {
                "error" => {}
                "ignore" => s.note(
                    key,
                    "walbox checks at start-up that every placed column exists and does not \
                     start otherwise; a placed column dropped while it runs makes each row \
                     invalid (on_invalid) instead of leaving its header out",
                ),
                _ => s.refuse(key, "must be error or ignore"),
            },
            "table.op.invalid.behavior" => {
                let on_change = match value.trim() {
                    "warn" | "error" => "warn",
                    // The router fails on an UPDATE only: it skips every DELETE.
                    "fatal" => "fail_update",
                    _ => {
                        s.refuse(key, "must be warn, error or fatal");
                        continue;
                    }
                };
                route.insert("on_change".into(), Value::String(on_change.into()));
            }
            "table.expand.json.payload" => match value.trim() {
                "true" => {
                    route.insert("expand_json_payload".into(), Value::Boolean(true));
                }
                "false" => {}
                _ => s.refuse(key, "must be true or false"),
            },
            "table.json.payload.null.behavior" => match value.trim() {
                "ignore" => {}
                "optional_bytes"
                    if route.get("expand_json_payload") != Some(&Value::Boolean(true)) =>
                {
                    s.note(
                        key,
                        "applies to expanded payloads only (table.expand.json.payload)",
                    )
                }
                "optional_bytes" => {
                    route.insert(
                        "json_payload_null_behavior".into(),
                        Value::String("optional_bytes".into()),
                    );
                }
                _ => s.refuse(key, "must be ignore or optional_bytes"),
            },
            "table.field.event.payload.id" => s.note(
                key,
                "deprecated and unused by the router; walbox has no equivalent",
            ),
            "table.field.event.schema.version" => s.refuse(
                key,
                "walbox writes no Connect schemas: put a version column in [outbox.headers]",
            ),
            r if r.starts_with("tracing.") => s.refuse(
                key,
                "walbox writes no tracing spans: map the span context column to a header \
                 ([outbox.headers] traceparent = \"traceparent\")",
            ),
            "predicate" | "negate" => s.refuse(
                key,
                "walbox applies the router to every row of the outbox tables; list only outbox \
                 tables in table.include.list",
            ),
            _ => s.refuse(key, "not a router setting walbox knows"),
        }
    }
}

/// `table.fields.additional.placement`: `column:header[:alias]`, `column:partition`,
/// `column:envelope[:alias]`, comma-separated.
fn placements(s: &mut Settings, key: &str, value: &str, route: &mut Table) {
    for (n, entry) in value.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            continue;
        }
        let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
        let placement = parts.get(1).map(|p| p.to_ascii_lowercase());
        match (parts.as_slice(), placement.as_deref()) {
            ([column, _], Some("header")) | ([column, _, _], Some("header")) => {
                let alias = parts.get(2).unwrap_or(column);
                let headers = subtable(route, "headers");
                if headers.contains_key(*column) {
                    s.refuse(
                        format!("{key} (entry {})", n + 1),
                        format!(
                            "column {column} is placed in a second header: walbox maps a column to one header"
                        ),
                    );
                } else {
                    headers.insert((*column).to_owned(), Value::String((*alias).to_owned()));
                }
            }
            ([column, _], Some("partition")) => {
                subtable(route, "columns")
                    .insert("partition".into(), Value::String((*column).to_owned()));
            }
            (_, Some("envelope")) => s.refuse(
                format!("{key} (entry {})", n + 1),
                "an envelope placement makes the value a Connect struct of the payload and the \
                 placed columns (named, with schemas, after the first routed value the task saw), \
                 which walbox does not write: place the column in a header, or use walbox's \
                 envelope (format = \"json\") and change the consumers",
            ),
            _ => s.refuse(
                format!("{key} (entry {})", n + 1),
                "is not column:header[:alias], column:partition or column:envelope[:alias]",
            ),
        }
    }
}
