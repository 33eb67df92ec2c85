//! Topic templates (`events.${aggregate_type}`): parsed once per route, rendered per event.
//!
//! The variables a template may use were checked when the config was loaded, so parsing never
//! fails; rendering gives `None` when a variable the template uses is NULL or not UTF-8, and the
//! route's `fallback_topic` (or its `on_invalid` policy) decides what follows.

use crate::config::RouteSource;

/// Values a topic template may use.
pub(super) struct Vars<'a> {
    pub(super) aggregate_type: Option<&'a [u8]>,
    pub(super) event_type: Option<&'a [u8]>,
    pub(super) source: &'a RouteSource,
}

#[derive(Debug, Clone)]
enum Segment {
    Literal(String),
    AggregateType,
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

    /// `None` when a variable it uses is NULL (or not UTF-8).
    pub(super) fn render(&self, v: &Vars<'_>) -> Option<String> {
        let mut s = String::with_capacity(48);
        for seg in &self.0 {
            match seg {
                Segment::Literal(l) => s.push_str(l),
                Segment::AggregateType => s.push_str(std::str::from_utf8(v.aggregate_type?).ok()?),
                Segment::EventType => s.push_str(std::str::from_utf8(v.event_type?).ok()?),
                Segment::Table => match v.source {
                    RouteSource::Table { table, .. } => s.push_str(table),
                    RouteSource::Messages { prefix } => s.push_str(prefix),
                },
                Segment::Schema => match v.source {
                    RouteSource::Table { schema, .. } => s.push_str(schema),
                    RouteSource::Messages { .. } => s.push_str("message"),
                },
            }
        }
        Some(s)
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
