//! `table.expand.json.payload`: the router's `JsonSchemaData`, which infers a Connect schema
//! from a JSON payload and converts the payload into a struct of it.
//!
//! Inference (`toConnectSchema`), by Jackson's node type: a string, boolean, `int`, `long` is
//! an optional `string`, `boolean`, `int32`, `int64`; any other number `double`; an object an
//! optional struct named by its path (`payload`, `payload.items`), whose null fields (and
//! empty arrays) are left out, or typed `bytes` with `optional_bytes`; a non-empty array an
//! optional array of the schema of its first non-null element, after every element was checked
//! to have that node type (and, for numbers, that schema). An array of objects has the merge of
//! its elements' distinct schemas: the first one's fields, then the fields the others add;
//! a merge of more than one schema is not optional (Connect's `copySchemaBasics` does not copy
//! it). An array of nothing but nulls, or of empty arrays, fails.
//!
//! Conversion (`toConnectData`) puts each field the document has, checked by Connect's
//! `Struct.put`: a field whose value's class does not match the (merged) schema, or an integer
//! beyond 64 bits (a `BigDecimal` for a `double` schema), fails.
//!
//! Debezium merges an array's element schemas in the order of a `HashSet`, which depends on
//! identity hash codes and so differs between runs of its task; walbox merges them in the order
//! the elements come (docs/migrating.md).

use super::data::{Schema, Type, Value};
use super::jackson::{read_tree, Node};

use crate::config::JsonNulls as NullFields;

/// What the router made of a payload it was asked to expand.
#[derive(Debug, Clone, PartialEq)]
pub enum Expanded {
    /// Not expanded (the text does not start with `{` or `[`, is not JSON, or its schema could
    /// not be inferred; Debezium logs "JSON expansion failed"): the payload stays as it was.
    Unchanged,
    /// The payload's new schema and struct.
    Struct(Schema, Value),
    /// The schema was inferred but the data could not be converted to it: the payload stays
    /// the string under the new schema (`None`: an empty top-level array has none).
    SchemaOnly(Option<Schema>),
}

/// Expands `text`, the payload column `field`'s string, as the router does.
pub fn expand(text: &str, field: &str, nulls: NullFields) -> Expanded {
    if !(text.starts_with('{') || text.starts_with('[')) {
        return Expanded::Unchanged;
    }
    let Some(node) = read_tree(text) else {
        return Expanded::Unchanged;
    };
    let schema = match infer(Some(field), &node, nulls) {
        Ok(s) => s,
        Err(()) => return Expanded::Unchanged,
    };
    match schema {
        Some(s) if matches!(s.ty, Type::Struct(_)) => match to_struct(&node, &s) {
            Some(v) => Expanded::Struct(s, v),
            None => Expanded::SchemaOnly(Some(s)),
        },
        other => Expanded::SchemaOnly(other),
    }
}

/// `toConnectSchema`; `Err` where it throws, `Ok(None)` where it returns null.
fn infer(key: Option<&str>, node: &Node, nulls: NullFields) -> Result<Option<Schema>, ()> {
    Ok(Some(match node {
        Node::Str(_) => Schema::optional(Type::String),
        Node::Bool(_) => Schema::optional(Type::Boolean),
        Node::Int(_) => Schema::optional(Type::Int32),
        Node::Long(_) => Schema::optional(Type::Int64),
        Node::BigInt(_) | Node::Double(_) => Schema::optional(Type::Float64),
        Node::Array(items) if items.is_empty() => return Ok(None),
        Node::Array(items) => {
            Schema::optional(Type::Array(Box::new(element_schema(key, items, nulls)?)))
        }
        Node::Object(entries) => {
            let mut fields: Vec<(String, Schema)> = Vec::new();
            for (name, value) in entries {
                let child = match key {
                    Some(k) if !k.trim().is_empty() => format!("{k}.{name}"),
                    _ => name.clone(),
                };
                if let Some(s) = infer(Some(&child), value, nulls)? {
                    if !fields.iter().any(|(n, _)| n == name) {
                        fields.push((name.clone(), s));
                    }
                }
            }
            Schema {
                ty: Type::Struct(fields),
                optional: true,
                name: key.map(str::to_owned),
                version: None,
            }
        }
        Node::Null => match nulls {
            NullFields::OptionalBytes => Schema::optional(Type::Bytes),
            NullFields::Ignore => return Ok(None),
        },
    }))
}

/// `toConnectSchemaWithCycles`: the schema of a non-empty array's elements.
fn element_schema(key: Option<&str>, items: &[Node], nulls: NullFields) -> Result<Schema, ()> {
    let sample = first_element(items, nulls)?;
    if let Node::Object(_) = sample {
        let mut distinct: Vec<Schema> = Vec::new();
        for item in items.iter().filter(|i| matches!(i, Node::Object(_))) {
            let s = infer(key, item, nulls)?.ok_or(())?;
            if !distinct.contains(&s) {
                distinct.push(s);
            }
        }
        let mut merged: Option<Schema> = None;
        for s in distinct {
            merged = Some(match merged {
                None => s,
                Some(left) => merge(left, s),
            });
        }
        merged.ok_or(())
    } else {
        infer(None, sample, nulls)?.ok_or(())
    }
}

/// `getFirstArrayElement`: the first non-null element, after checking that every non-null
/// element has its node type (and, for numbers, its schema). `Node::Null` when all are null.
fn first_element(items: &[Node], nulls: NullFields) -> Result<&Node, ()> {
    let kind = |n: &Node| std::mem::discriminant(&number_class(n));
    let mut first: Option<&Node> = None;
    for item in items.iter().filter(|i| **i != Node::Null) {
        let Some(f) = first else {
            first = Some(item);
            continue;
        };
        if kind(f) != kind(item) {
            return Err(());
        }
        if number_class(f) == NodeType::Number
            && infer(None, f, nulls)?.map(|s| s.ty) != infer(None, item, nulls)?.map(|s| s.ty)
        {
            return Err(());
        }
    }
    Ok(first.unwrap_or(&Node::Null))
}

/// Jackson's `JsonNodeType`.
#[derive(Debug, PartialEq, Eq)]
enum NodeType {
    Null,
    Boolean,
    Number,
    String,
    Array,
    Object,
}

fn number_class(n: &Node) -> NodeType {
    match n {
        Node::Null => NodeType::Null,
        Node::Bool(_) => NodeType::Boolean,
        Node::Int(_) | Node::Long(_) | Node::BigInt(_) | Node::Double(_) => NodeType::Number,
        Node::Str(_) => NodeType::String,
        Node::Array(_) => NodeType::Array,
        Node::Object(_) => NodeType::Object,
    }
}

/// `mergeSchema`: `left`'s fields, then the fields only `right` has; a `bytes` field of
/// `left` takes `right`'s other type. Name and version are `left`'s; optional is not kept.
fn merge(left: Schema, right: Schema) -> Schema {
    let (Type::Struct(mut fields), Type::Struct(more)) = (left.ty, right.ty) else {
        unreachable!("only object schemas are merged")
    };
    for (name, s) in more {
        match fields.iter_mut().find(|(n, _)| *n == name) {
            None => fields.push((name, s)),
            Some((_, old)) => {
                if *old != s && old.ty == Type::Bytes && s.ty != Type::Bytes {
                    *old = s;
                }
            }
        }
    }
    Schema {
        ty: Type::Struct(fields),
        optional: false,
        name: left.name,
        version: left.version,
    }
}

/// `jsonNodeToStructInternal` with `Struct.put`'s checks; `None` where they throw.
fn to_struct(node: &Node, schema: &Schema) -> Option<Value> {
    let (Node::Object(entries), Type::Struct(fields)) = (node, &schema.ty) else {
        return None;
    };
    let mut values = Vec::with_capacity(fields.len());
    for (name, field) in fields {
        let v = match entries.iter().find(|(k, _)| k == name) {
            Some((_, child)) => {
                let v = field_value(child, field)?;
                valid(&v, field).then_some(v)?
            }
            None => Value::Null,
        };
        values.push(v);
    }
    Some(Value::Struct(values))
}

/// `getStructFieldValue`: the value by the node's type, whatever the schema says.
fn field_value(node: &Node, schema: &Schema) -> Option<Value> {
    Some(match node {
        Node::Null => Value::Null,
        Node::Bool(b) => Value::Boolean(*b),
        Node::Int(i) => Value::Int32(*i),
        Node::Long(l) => Value::Int64(*l),
        Node::Double(d) => Value::Float64(*d),
        Node::BigInt(t) => Value::Decimal(t.clone()),
        Node::Str(s) => Value::String(s.clone()),
        Node::Array(items) => {
            let item = match &schema.ty {
                Type::Array(i) => Some(&**i),
                _ => None,
            };
            let mut list = Vec::with_capacity(items.len());
            for i in items {
                list.push(match item {
                    Some(s) => field_value(i, s)?,
                    // No element schema: only nulls and scalars convert.
                    None => field_value(i, &Schema::optional(Type::Bytes))?,
                });
            }
            Value::Array(list)
        }
        Node::Object(_) => to_struct(node, schema)?,
    })
}

/// `ConnectSchema.validateValue`: whether `v` is valid for `s`.
fn valid(v: &Value, s: &Schema) -> bool {
    match (v, &s.ty) {
        (Value::Null, _) => s.optional,
        (Value::Boolean(_), Type::Boolean)
        | (Value::Int16(_), Type::Int16)
        | (Value::Int32(_), Type::Int32)
        | (Value::Int64(_), Type::Int64)
        | (Value::Float64(_), Type::Float64)
        | (Value::String(_), Type::String)
        | (Value::Bytes(_), Type::Bytes)
        | (Value::Struct(_), Type::Struct(_)) => true,
        (Value::Array(items), Type::Array(item)) => items.iter().all(|i| valid(i, item)),
        _ => false,
    }
}
