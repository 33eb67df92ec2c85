//! Topic templates (`events.${aggregate_type}`; for the brokers that route by it, a NATS subject
//! or a RabbitMQ routing key such as `orders.${aggregate_id}`): parsed once per route, rendered
//! per event.
//!
//! The variables a template may use were checked when the config was loaded, so parsing never
//! fails; rendering gives `None` when a variable the template uses is NULL or not UTF-8, and the
//! route's `fallback_topic` (or its `on_invalid` policy) decides what follows.

use crate::config::RouteSource;

/// Values a topic template may use.
pub(super) struct Vars<'a> {
    pub(super) aggregate_type: Option<&'a [u8]>,
    /// The event's key (the aggregate id column).
    pub(super) aggregate_id: Option<&'a [u8]>,
    pub(super) event_type: Option<&'a [u8]>,
    pub(super) source: &'a RouteSource,
}

#[derive(Debug, Clone)]
enum Segment {
    Literal(String),
    AggregateType,
    AggregateId,
    EventType,
    Table,
    Schema,
}

/// A parsed topic template (`events.${aggregate_type}`); variables were checked by the config.
#[derive(Debug, Clone)]
pub(super) struct Template(Vec<Segment>);

impl Template {
    pub(super) fn parse(t: &str) -> Template {
        let mut out = Vec::new();
        let mut rest = t;
        while let Some(i) = rest.find("${") {
            if i > 0 {
                out.push(Segment::Literal(rest[..i].to_owned()));
            }
            let after = &rest[i + 2..];
            let end = after.find('}').unwrap_or(after.len());
            out.push(match &after[..end] {
                "aggregate_type" => Segment::AggregateType,
                "aggregate_id" => Segment::AggregateId,
                "event_type" => Segment::EventType,
                "table" => Segment::Table,
                _ => Segment::Schema,
            });
            rest = after.get(end + 1..).unwrap_or("");
        }
        if !rest.is_empty() {
            out.push(Segment::Literal(rest.to_owned()));
        }
        Template(out)
    }

    /// The topic for `v`, into `out` (cleared first); `false` when a variable is NULL or not
    /// UTF-8.
    pub(super) fn render_into(&self, v: &Vars<'_>, out: &mut String) -> bool {
        out.clear();
        for seg in &self.0 {
            let part = match seg {
                Segment::Literal(l) => Some(&l[..]),
                Segment::AggregateType => {
                    v.aggregate_type.and_then(|b| std::str::from_utf8(b).ok())
                }
                Segment::AggregateId => v.aggregate_id.and_then(|b| std::str::from_utf8(b).ok()),
                Segment::EventType => v.event_type.and_then(|b| std::str::from_utf8(b).ok()),
                Segment::Table => Some(match v.source {
                    RouteSource::Table { table, .. } => &table[..],
                    RouteSource::Messages { prefix } => &prefix[..],
                }),
                Segment::Schema => Some(match v.source {
                    RouteSource::Table { schema, .. } => &schema[..],
                    RouteSource::Messages { .. } => "message",
                }),
            };
            match part {
                Some(p) => out.push_str(p),
                None => return false,
            }
        }
        true
    }
}

impl Template {
    /// The topic itself when the template uses no variable.
    pub(super) fn literal(&self) -> Option<&str> {
        match self.0.as_slice() {
            [Segment::Literal(l)] => Some(l),
            _ => None,
        }
    }
}
