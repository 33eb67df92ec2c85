//! Kafka Connect's data, as Debezium's Outbox Event Router hands a record's key and value to
//! Connect's converters, and the bytes those converters write: `JsonConverter` with and
//! without schemas, and `StringConverter` for an expanded payload (a Connect struct's
//! `toString()`). Used by routes in `compat = "debezium"` whose `[outbox.converters]` name
//! `json`, or that expand JSON payloads (`expand_json_payload`).
//!
//! ```text
//! column text ──column_value──▶ (Schema, Value) ──expand (router)──▶ (Schema, Value)
//!             ──json / to_string──▶ bytes, or a ConvertError where Connect's task fails
//! ```
//!
//! Written here, not taken from a crate: the output must equal Java's, byte for byte, including
//! what Jackson escapes, how Java prints a double, the order of keys in a schema, and which
//! payloads make Debezium's task fail; no Rust crate reproduces any of that (see [`jackson`]).
//!
//! Invariants:
//! - A column's schema is Debezium's for its type: json/jsonb a string named
//!   `io.debezium.data.Json`, uuid a string named `io.debezium.data.Uuid`, int2/int4/int8
//!   `int16`/`int32`/`int64`, bytea `bytes`, any text type a string; optional when the column
//!   is nullable.
//! - Expansion ([`expand`]) follows Debezium 3.6's `JsonSchemaData` step by step, including
//!   what happens when it throws: a failure while inferring the schema leaves the payload as it
//!   was; a failure while converting the data leaves the string under the new schema, which
//!   `JsonConverter` then refuses.
//! - Where Connect would throw, these functions return a [`ConvertError`] that says why; the
//!   mapper makes it the row's fault (`on_invalid`), never a skipped event.

mod data;
pub mod jackson;
mod schema;

#[cfg(test)]
mod tests;

pub use crate::source::column_type::ColumnType;
pub use data::{Schema, Type, Value};
pub use schema::{expand, Expanded};

use bytes::Bytes;

use crate::config::{Converter, JsonNulls};
use crate::failure::{Classify, Failure};

use jackson::{java_double, write_string};

/// Why Connect would fail the record (and Debezium's task with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConvertError(pub String);

impl Classify for ConvertError {
    /// The record's fault: the row is invalid (`on_invalid`: exit 8, or a dead letter).
    fn failure(&self) -> Option<Failure> {
        Some(Failure::EventRejected)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConvertError> {
    Err(ConvertError(msg.into()))
}

impl ColumnType {
    /// Debezium's schema for a column of this type.
    pub fn schema(self, nullable: bool) -> Schema {
        let (ty, name) = match self {
            ColumnType::Json => (Type::String, Some(Schema::JSON)),
            ColumnType::Uuid => (Type::String, Some(Schema::UUID)),
            ColumnType::Int16 => (Type::Int16, None),
            ColumnType::Int32 => (Type::Int32, None),
            ColumnType::Int64 => (Type::Int64, None),
            ColumnType::Bytes => (Type::Bytes, None),
            ColumnType::Text => (Type::String, None),
        };
        Schema {
            ty,
            optional: nullable,
            version: name.map(|_| 1),
            name: name.map(str::to_owned),
        }
    }

    /// The Connect value of a column of this type from its text output (bytea already
    /// decoded), `None` for SQL NULL.
    pub fn value(self, raw: Option<&[u8]>) -> Result<Value, ConvertError> {
        let Some(raw) = raw else {
            return Ok(Value::Null);
        };
        let text = || {
            std::str::from_utf8(raw)
                .map_err(|_| ConvertError("the column's text is not UTF-8".into()))
        };
        let number = |what: &str| ConvertError(format!("the {what} column's text is not a number"));
        Ok(match self {
            ColumnType::Bytes => Value::Bytes(raw.to_vec()),
            ColumnType::Int16 => Value::Int16(text()?.parse().map_err(|_| number("int2"))?),
            ColumnType::Int32 => Value::Int32(text()?.parse().map_err(|_| number("int4"))?),
            ColumnType::Int64 => Value::Int64(text()?.parse().map_err(|_| number("int8"))?),
            ColumnType::Json | ColumnType::Uuid | ColumnType::Text => Value::String(text()?.into()),
        })
    }
}

/// The bytes `JsonConverter` writes for `value` under `schema` (`schemas`: its
/// `schemas.enable`); `None` is a null record value (no schema and no value).
pub fn json(
    schema: Option<&Schema>,
    value: &Value,
    schemas: bool,
) -> Result<Option<Vec<u8>>, ConvertError> {
    if schema.is_none() && *value == Value::Null {
        return Ok(None);
    }
    let mut out = Vec::new();
    if schemas {
        out.extend_from_slice(b"{\"schema\":");
        match schema {
            Some(s) => write_schema(&mut out, s, None),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"payload\":");
        write_value(&mut out, schema, value)?;
        out.push(b'}');
    } else {
        write_value(&mut out, schema, value)?;
    }
    Ok(Some(out))
}

/// `JsonConverter.asJsonSchema`: `type`, then `items` or `fields`, `optional`, `name`,
/// `version`; `field` last for a struct's field.
fn write_schema(out: &mut Vec<u8>, s: &Schema, field: Option<&str>) {
    let type_name = match &s.ty {
        Type::Boolean => "boolean",
        Type::Int16 => "int16",
        Type::Int32 => "int32",
        Type::Int64 => "int64",
        Type::Float64 => "double",
        Type::String => "string",
        Type::Bytes => "bytes",
        Type::Array(_) => "array",
        Type::Struct(_) => "struct",
    };
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(type_name.as_bytes());
    out.push(b'"');
    match &s.ty {
        Type::Array(items) => {
            out.extend_from_slice(b",\"items\":");
            write_schema(out, items, None);
        }
        Type::Struct(fields) => {
            out.extend_from_slice(b",\"fields\":[");
            for (i, (name, f)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_schema(out, f, Some(name));
            }
            out.push(b']');
        }
        _ => {}
    }
    out.extend_from_slice(if s.optional {
        b",\"optional\":true"
    } else {
        b",\"optional\":false"
    });
    if let Some(name) = &s.name {
        out.extend_from_slice(b",\"name\":");
        write_string(out, name);
    }
    if let Some(v) = s.version {
        out.extend_from_slice(format!(",\"version\":{v}").as_bytes());
    }
    if let Some(name) = field {
        out.extend_from_slice(b",\"field\":");
        write_string(out, name);
    }
    out.push(b'}');
}

/// `JsonConverter.convertToJson`: by the schema's type, or by the value's class without one.
fn write_value(out: &mut Vec<u8>, s: Option<&Schema>, v: &Value) -> Result<(), ConvertError> {
    let Some(s) = s else {
        return write_schemaless(out, v);
    };
    let mismatch = || {
        err(format!(
            "Connect's JsonConverter refuses a {} value for a {:?} schema",
            class(v),
            s.ty
        ))
    };
    match (&s.ty, v) {
        (_, Value::Null) if s.optional => out.extend_from_slice(b"null"),
        (_, Value::Null) => {
            return err("Connect's JsonConverter refuses a null value for a required field")
        }
        (Type::Boolean, Value::Boolean(b)) => {
            out.extend_from_slice(if *b { b"true" } else { b"false" })
        }
        (Type::Int16, Value::Int16(n)) => out.extend_from_slice(n.to_string().as_bytes()),
        (Type::Int32, Value::Int32(n)) => out.extend_from_slice(n.to_string().as_bytes()),
        (Type::Int64, Value::Int64(n)) => out.extend_from_slice(n.to_string().as_bytes()),
        (Type::Float64, Value::Float64(d)) => write_double(out, *d),
        (Type::String, Value::String(t)) => write_string(out, t),
        (Type::Bytes, Value::Bytes(b)) => write_string(out, &crate::outbox::envelope::base64(b)),
        (Type::Array(items), Value::Array(list)) => {
            out.push(b'[');
            for (i, e) in list.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, Some(items), e)?;
            }
            out.push(b']');
        }
        (Type::Struct(fields), Value::Struct(values)) => {
            out.push(b'{');
            for (i, ((name, f), value)) in fields.iter().zip(values).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, name);
                out.push(b':');
                write_value(out, Some(f), value)?;
            }
            out.push(b'}');
        }
        _ => return mismatch(),
    }
    Ok(())
}

/// A value without a schema: typed by its class (only strings reach here: a payload whose
/// expanded schema was empty).
fn write_schemaless(out: &mut Vec<u8>, v: &Value) -> Result<(), ConvertError> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::String(t) => write_string(out, t),
        Value::Bytes(b) => write_string(out, &crate::outbox::envelope::base64(b)),
        other => {
            return err(format!(
                "Connect's JsonConverter has no schema for a {}",
                class(other)
            ))
        }
    }
    Ok(())
}

/// Jackson writes a finite double as `Double.toString` does, NaN and infinities quoted.
fn write_double(out: &mut Vec<u8>, d: f64) {
    let text = java_double(d);
    if d.is_finite() {
        out.extend_from_slice(text.as_bytes());
    } else {
        write_string(out, &text);
    }
}

/// The Java class of a value, for messages.
fn class(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Boolean(_) => "Boolean",
        Value::Int16(_) => "Short",
        Value::Int32(_) => "Integer",
        Value::Int64(_) => "Long",
        Value::Float64(_) => "Double",
        Value::Decimal(_) => "BigDecimal",
        Value::String(_) => "String",
        Value::Bytes(_) => "byte[]",
        Value::Array(_) => "List",
        Value::Struct(_) => "Struct",
    }
}

/// `value.toString()`, as `StringConverter` writes a value: a struct as
/// `Struct{name=value,…}` with its null fields left out, a list as `[a, b]`, a double as Java
/// prints it.
pub fn to_string(schema: Option<&Schema>, value: &Value) -> String {
    let mut out = String::new();
    java_string(&mut out, schema, value);
    out
}

fn java_string(out: &mut String, schema: Option<&Schema>, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int16(n) => out.push_str(&n.to_string()),
        Value::Int32(n) => out.push_str(&n.to_string()),
        Value::Int64(n) => out.push_str(&n.to_string()),
        Value::Float64(d) => out.push_str(&java_double(*d)),
        Value::Decimal(t) | Value::String(t) => out.push_str(t),
        // `byte[].toString()` is its identity (`[B@1b6d3586`); no bytes reach here but the
        // null placeholders of `optional_bytes`, which are left out.
        Value::Bytes(_) => out.push_str("[B"),
        Value::Array(items) => {
            let item = match schema.map(|s| &s.ty) {
                Some(Type::Array(i)) => Some(&**i),
                _ => None,
            };
            out.push('[');
            for (i, e) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                java_string(out, item, e);
            }
            out.push(']');
        }
        Value::Struct(values) => {
            let fields: &[(String, Schema)] = match schema.map(|s| &s.ty) {
                Some(Type::Struct(f)) => f,
                _ => &[],
            };
            out.push_str("Struct{");
            let mut first = true;
            for ((name, f), v) in fields.iter().zip(values) {
                if *v == Value::Null {
                    continue;
                }
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(name);
                out.push('=');
                java_string(out, Some(f), v);
            }
            out.push('}');
        }
    }
}

/// A mapped column as Debezium types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Its Connect type.
    pub ty: ColumnType,
    /// Whether it is nullable (the schema's `optional`).
    pub nullable: bool,
}

/// The record key `JsonConverter` writes for the key column's text `raw` (`None`: NULL).
pub fn record_key(
    column: Column,
    raw: Option<&[u8]>,
    schemas: bool,
) -> Result<Option<Bytes>, ConvertError> {
    let schema = column.ty.schema(column.nullable);
    Ok(json(Some(&schema), &column.ty.value(raw)?, schemas)?.map(Bytes::from))
}

/// The record value the router's `converter` writes for the payload column `field`'s value
/// `raw` (its text, or bytea's bytes; `None`: NULL), expanded first when `expand_json` is on.
/// Under `StringConverter` a payload that was not expanded is `raw` itself.
pub fn record_value(
    column: Column,
    field: &str,
    raw: Option<&Bytes>,
    expand_json: Option<JsonNulls>,
    converter: Converter,
) -> Result<Option<Bytes>, ConvertError> {
    let mut schema = Some(column.ty.schema(column.nullable));
    let mut value = column.ty.value(raw.map(|b| &b[..]))?;
    let mut expanded = false;
    if let (Some(nulls), Value::String(text)) = (expand_json, &value) {
        match expand(text, field, nulls) {
            Expanded::Unchanged => {}
            Expanded::Struct(s, v) => {
                schema = Some(s);
                value = v;
                expanded = true;
            }
            Expanded::SchemaOnly(s) => schema = s,
        }
    }
    match converter {
        Converter::String if expanded => Ok(Some(Bytes::from(to_string(schema.as_ref(), &value)))),
        Converter::String => Ok(raw.cloned()),
        Converter::Json { schemas } => Ok(json(schema.as_ref(), &value, schemas)?.map(Bytes::from)),
    }
}
