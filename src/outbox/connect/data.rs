//! Kafka Connect's schemas and values, as far as Debezium's outbox records use them (no
//! defaults, docs, parameters or maps). Values are typed by the Java class Connect checks them
//! by, which is what decides whether a struct accepts them.

/// A Connect schema type, with what it contains.
#[derive(Debug, Clone, PartialEq)]
pub enum Type {
    /// `boolean`.
    Boolean,
    /// `int16`.
    Int16,
    /// `int32`.
    Int32,
    /// `int64`.
    Int64,
    /// `double`.
    Float64,
    /// `string`.
    String,
    /// `bytes`.
    Bytes,
    /// `array` of one schema.
    Array(Box<Schema>),
    /// `struct`: its fields, in order.
    Struct(Vec<(String, Schema)>),
}

/// A Connect schema (the parts Debezium's outbox records use: no defaults, docs or
/// parameters).
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    /// Type.
    pub ty: Type,
    /// Whether null is a valid value.
    pub optional: bool,
    /// Logical name.
    pub name: Option<String>,
    /// Version.
    pub version: Option<i32>,
}

impl Schema {
    /// An optional schema of `ty` with no name.
    pub fn optional(ty: Type) -> Schema {
        Schema {
            ty,
            optional: true,
            name: None,
            version: None,
        }
    }

    /// Debezium's name for a json/jsonb column.
    pub const JSON: &'static str = "io.debezium.data.Json";
    /// Debezium's name for a uuid column.
    pub const UUID: &'static str = "io.debezium.data.Uuid";
}

/// A Connect value, by the Java class it has (Connect validates values by class).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `Boolean`.
    Boolean(bool),
    /// `Short`.
    Int16(i16),
    /// `Integer`.
    Int32(i32),
    /// `Long`.
    Int64(i64),
    /// `Double`.
    Float64(f64),
    /// `BigDecimal` (a JSON integer beyond 64 bits): valid for no inferred schema.
    Decimal(String),
    /// `String`.
    String(String),
    /// `byte[]`.
    Bytes(Vec<u8>),
    /// `List`.
    Array(Vec<Value>),
    /// `Struct`: one value per field of its schema, [`Value::Null`] where none was put.
    Struct(Vec<Value>),
}
