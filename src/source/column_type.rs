//! The PostgreSQL types of outbox key and payload columns that Debezium's PostgreSQL connector
//! maps to distinct Kafka Connect types, by type OID (pgoutput's Relation message) or by
//! `format_type` name (the catalog). `crate::outbox::connect` gives each its Connect schema
//! and value; the catalog refuses, at start-up, a JSON-converted column of any other type.

/// What a column type is in Connect, as Debezium's PostgreSQL connector maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// json, jsonb.
    Json,
    /// uuid.
    Uuid,
    /// int2.
    Int16,
    /// int4.
    Int32,
    /// int8.
    Int64,
    /// bytea.
    Bytes,
    /// text, varchar, bpchar.
    Text,
}

impl ColumnType {
    /// The Connect type of a column of PostgreSQL type `oid`, when walbox reproduces it.
    pub fn of_oid(oid: u32) -> Option<ColumnType> {
        Some(match oid {
            114 | 3802 => ColumnType::Json,
            2950 => ColumnType::Uuid,
            21 => ColumnType::Int16,
            23 => ColumnType::Int32,
            20 => ColumnType::Int64,
            17 => ColumnType::Bytes,
            25 | 1043 | 1042 => ColumnType::Text,
            _ => return None,
        })
    }

    /// The same for a type as `format_type` names it (`character varying(255)`).
    pub fn of_name(name: &str) -> Option<ColumnType> {
        let base = name.split('(').next().unwrap_or(name).trim();
        Some(match base {
            "json" | "jsonb" => ColumnType::Json,
            "uuid" => ColumnType::Uuid,
            "smallint" => ColumnType::Int16,
            "integer" => ColumnType::Int32,
            "bigint" => ColumnType::Int64,
            "bytea" => ColumnType::Bytes,
            "text" | "character varying" | "character" => ColumnType::Text,
            _ => return None,
        })
    }
}
