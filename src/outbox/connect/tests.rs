use super::jackson::{java_double, read_tree, write_string, Node};
use super::*;
use crate::config::JsonNulls as NullFields;

fn json_of(text: &str, schemas: bool) -> String {
    let column = ColumnType::Json.schema(true);
    let (schema, value) = match expand(text, "payload", NullFields::Ignore) {
        Expanded::Struct(s, v) => (Some(s), v),
        Expanded::SchemaOnly(s) => (s, Value::String(text.into())),
        Expanded::Unchanged => (Some(column), Value::String(text.into())),
    };
    String::from_utf8(json(schema.as_ref(), &value, schemas).unwrap().unwrap()).unwrap()
}

#[test]
fn doubles_print_as_java_prints_them() {
    for (d, java) in [
        (1e-7, "1.0E-7"),
        (100.0, "100.0"),
        (0.001, "0.001"),
        (1234567.0, "1234567.0"),
        (1e7, "1.0E7"),
        (12345678.9, "1.23456789E7"),
        (-2.5, "-2.5"),
        (0.1, "0.1"),
        (0.000123, "1.23E-4"),
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (1.5e300, "1.5E300"),
    ] {
        assert_eq!(java_double(d), java, "{d:e}");
    }
}

#[test]
fn strings_are_escaped_as_jackson_escapes_them() {
    let mut out = Vec::new();
    write_string(&mut out, "a\"b\\c\u{1}\t\n\u{1f}\u{7f}é✓🎉/");
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "\"a\\\"b\\\\c\\u0001\\t\\n\\u001F\u{7f}é✓\\uD83C\\uDF89/\""
    );
}

#[test]
fn numbers_are_typed_as_jackson_types_them() {
    let Some(Node::Array(items)) =
        read_tree("[1, -2147483649, 9223372036854775808, 1.0, 1e2, -0, 2147483647]")
    else {
        panic!("an array")
    };
    assert_eq!(
        items,
        vec![
            Node::Int(1),
            Node::Long(-2147483649),
            Node::BigInt("9223372036854775808".into()),
            Node::Double(1.0),
            Node::Double(100.0),
            Node::Int(0),
            Node::Int(2147483647),
        ]
    );
    assert_eq!(read_tree("{\"a\": 1, \"a\": 2, \"b\": 3} trailing"), {
        Some(Node::Object(vec![
            ("a".into(), Node::Int(2)),
            ("b".into(), Node::Int(3)),
        ]))
    });
    assert_eq!(read_tree("{\"a\": }"), None);
}

#[test]
fn an_expanded_payload_drops_nulls_and_prints_java_doubles() {
    // The example: jsonb text in, Debezium's bytes out.
    assert_eq!(
        json_of("{\"a\": null, \"b\": 1, \"c\": {\"d\": null}}", false),
        "{\"b\":1,\"c\":{}}"
    );
    assert_eq!(
        json_of("{\"x\": 0.0000001, \"s\": \"\u{1f389}\"}", false),
        "{\"x\":1.0E-7,\"s\":\"\\uD83C\\uDF89\"}"
    );
    assert_eq!(
        json_of("{\"b\": 1, \"l\": [1, 2]}", true),
        "{\"schema\":{\"type\":\"struct\",\"fields\":[\
         {\"type\":\"int32\",\"optional\":true,\"field\":\"b\"},\
         {\"type\":\"array\",\"items\":{\"type\":\"int32\",\"optional\":true},\"optional\":true,\"field\":\"l\"}],\
         \"optional\":true,\"name\":\"payload\"},\
         \"payload\":{\"b\":1,\"l\":[1,2]}}"
    );
}

#[test]
fn a_string_payload_under_schemas_carries_debeziums_json_name() {
    assert_eq!(
        String::from_utf8(
            json(
                Some(&ColumnType::Json.schema(true)),
                &Value::String("{\"a\": 1}".into()),
                true
            )
            .unwrap()
            .unwrap()
        )
        .unwrap(),
        "{\"schema\":{\"type\":\"string\",\"optional\":true,\"name\":\"io.debezium.data.Json\",\"version\":1},\
         \"payload\":\"{\\\"a\\\": 1}\"}"
    );
    // A NULL payload is a null value, not a missing record, under a schema.
    assert_eq!(
        json(Some(&ColumnType::Json.schema(true)), &Value::Null, false).unwrap(),
        Some(b"null".to_vec())
    );
    assert!(json(Some(&ColumnType::Json.schema(false)), &Value::Null, false).is_err());
    assert_eq!(json(None, &Value::Null, true).unwrap(), None);
}

#[test]
fn expansion_failures_follow_the_routers_two_outcomes() {
    // Mixed element types: the schema cannot be inferred, the payload stays a string.
    assert_eq!(
        expand("[1, \"x\"]", "payload", NullFields::Ignore),
        Expanded::Unchanged
    );
    assert_eq!(
        expand("{\"a\": [1, 2.5]}", "payload", NullFields::Ignore),
        Expanded::Unchanged
    );
    assert_eq!(
        expand("\"text\"", "payload", NullFields::Ignore),
        Expanded::Unchanged
    );
    // A top-level array has a schema but never converts: JsonConverter then refuses it.
    let Expanded::SchemaOnly(Some(s)) = expand("[1, 2]", "payload", NullFields::Ignore) else {
        panic!("schema only")
    };
    assert!(json(Some(&s), &Value::String("[1, 2]".into()), false).is_err());
    assert_eq!(
        expand("[]", "payload", NullFields::Ignore),
        Expanded::SchemaOnly(None)
    );
    // An integer beyond 64 bits: a double schema, a BigDecimal value.
    assert!(matches!(
        expand(
            "{\"n\": 18446744073709551616}",
            "payload",
            NullFields::Ignore
        ),
        Expanded::SchemaOnly(Some(_))
    ));
}

#[test]
fn arrays_of_objects_merge_their_schemas() {
    let Expanded::Struct(s, v) = expand(
        "{\"items\": [{\"a\": 1}, {\"b\": \"x\"}, {\"a\": 2}]}",
        "payload",
        NullFields::Ignore,
    ) else {
        panic!("expanded")
    };
    assert_eq!(
        String::from_utf8(json(Some(&s), &v, false).unwrap().unwrap()).unwrap(),
        "{\"items\":[{\"a\":1,\"b\":null},{\"a\":null,\"b\":\"x\"},{\"a\":2,\"b\":null}]}"
    );
    assert_eq!(
        to_string(Some(&s), &v),
        "Struct{items=[Struct{a=1}, Struct{b=x}, Struct{a=2}]}"
    );
    // The merged element schema is required: a null element fails the conversion.
    assert!(matches!(
        expand(
            "{\"items\": [{\"a\": 1}, {\"b\": 2}, null]}",
            "payload",
            NullFields::Ignore
        ),
        Expanded::SchemaOnly(Some(_))
    ));
}

#[test]
fn optional_bytes_keeps_null_fields() {
    let Expanded::Struct(s, v) = expand(
        "{\"a\": null, \"b\": 1}",
        "payload",
        NullFields::OptionalBytes,
    ) else {
        panic!("expanded")
    };
    assert_eq!(
        String::from_utf8(json(Some(&s), &v, false).unwrap().unwrap()).unwrap(),
        "{\"a\":null,\"b\":1}"
    );
    assert_eq!(to_string(Some(&s), &v), "Struct{b=1}");
}

#[test]
fn struct_to_string_is_connects() {
    let Expanded::Struct(s, v) = expand(
        "{\"a\": 1, \"b\": [1, 2], \"c\": {\"d\": \"x y\", \"e\": 1.5}, \"f\": true}",
        "payload",
        NullFields::Ignore,
    ) else {
        panic!("expanded")
    };
    assert_eq!(
        to_string(Some(&s), &v),
        "Struct{a=1,b=[1, 2],c=Struct{d=x y,e=1.5},f=true}"
    );
}

#[test]
fn column_values_and_keys() {
    let key = ColumnType::Uuid.schema(false);
    let v = ColumnType::Uuid
        .value(Some(b"0f8fad5b-d9cb-469f-a165-70867728950e"))
        .unwrap();
    assert_eq!(
        String::from_utf8(json(Some(&key), &v, true).unwrap().unwrap()).unwrap(),
        "{\"schema\":{\"type\":\"string\",\"optional\":false,\"name\":\"io.debezium.data.Uuid\",\"version\":1},\
         \"payload\":\"0f8fad5b-d9cb-469f-a165-70867728950e\"}"
    );
    let n = ColumnType::Int64.value(Some(b"42")).unwrap();
    assert_eq!(
        json(Some(&ColumnType::Int64.schema(true)), &n, false).unwrap(),
        Some(b"42".to_vec())
    );
    assert_eq!(
        json(
            Some(&ColumnType::Bytes.schema(true)),
            &Value::Bytes(b"hi".to_vec()),
            false
        )
        .unwrap(),
        Some(b"\"aGk=\"".to_vec())
    );
    assert!(ColumnType::Int32.value(Some(b"x")).is_err());
    assert_eq!(
        ColumnType::of_name("character varying(255)"),
        Some(ColumnType::Text)
    );
    assert_eq!(ColumnType::of_name("numeric"), None);
}
