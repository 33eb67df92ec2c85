use std::io::Write;

use super::*;
use crate::config::{Compat, Config};

/// A connector as Debezium's outbox documentation writes it, with header placements and a
/// password, in `.properties` form.
const PROPERTIES: &str = r#"
# The outbox connector.
name=outbox-connector
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=db.internal
database.port: 5433
database.user=outbox_reader
database.password=pg-s3cr3t-value
database.dbname=shop
topic.prefix=shop
plugin.name=pgoutput
slot.name=dbz_outbox
publication.name=dbz_outbox_pub
publication.autocreate.mode=filtered
table.include.list=public.outbox
snapshot.mode=no_data
tombstones.on.delete=false
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.route.topic.replacement=dbz.outbox.event.${routedByValue}
transforms.outbox.table.fields.additional.placement=type:header:eventType,\
    tenant:header:tenant,traceparent:header
"#;

/// The same connector as the JSON posted to Connect's REST API.
fn rest_json() -> String {
    serde_json::json!({
        "name": "outbox-connector",
        "config": {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max": 1,
            "database.hostname": "db.internal",
            "database.port": 5433,
            "database.user": "outbox_reader",
            "database.password": "pg-s3cr3t-value",
            "database.dbname": "shop",
            "topic.prefix": "shop",
            "plugin.name": "pgoutput",
            "slot.name": "dbz_outbox",
            "publication.name": "dbz_outbox_pub",
            "publication.autocreate.mode": "filtered",
            "table.include.list": "public.outbox",
            "snapshot.mode": "no_data",
            "tombstones.on.delete": false,
            "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.route.topic.replacement": "dbz.outbox.event.${routedByValue}",
            "transforms.outbox.table.fields.additional.placement":
                "type:header:eventType,tenant:header:tenant,traceparent:header"
        }
    })
    .to_string()
}

/// Loads `toml` with walbox's own loader, the password from a file and the brokers from the
/// environment, as the printed notes tell the operator to.
fn load(toml: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("walbox.toml");
    std::fs::write(&path, toml).unwrap();
    let password = dir.path().join("pw");
    std::fs::write(&password, "pg-s3cr3t-value\n").unwrap();
    let kafka_password = dir.path().join("kafka-pw");
    std::fs::write(&kafka_password, "k4fka-s3cr3t\n").unwrap();
    let env = [
        (
            "WALBOX_POSTGRES_PASSWORD_FILE",
            password.display().to_string(),
        ),
        (
            "WALBOX_KAFKA_PROPERTY_FILE_SASL_PASSWORD",
            kafka_password.display().to_string(),
        ),
        ("WALBOX_KAFKA_BROKERS", "kafka-1:9092".to_owned()),
    ];
    let mut env = env.into_iter().map(|(k, v)| (k.to_owned(), v));
    crate::config::load_from(Some(&path), &mut env)
        .unwrap_or_else(|e| panic!("{e}; the printed configuration:\n{toml}"))
}

#[test]
fn a_properties_file_becomes_a_configuration_walbox_loads() {
    let r = render(PROPERTIES).unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    let config = load(&r.toml);
    let pg = &config.postgres;
    assert_eq!(
        (
            pg.conn.host_label(),
            pg.conn.user.as_str(),
            pg.conn.dbname.as_str()
        ),
        ("db.internal:5433".to_owned(), "outbox_reader", "shop")
    );
    assert_eq!(pg.conn.password.as_deref(), Some("pg-s3cr3t-value"));
    assert_eq!(
        (pg.slot.as_str(), pg.publication.as_str()),
        ("dbz_outbox", "dbz_outbox_pub")
    );
    assert!(!pg.create_slot && !pg.create_publication);
    let route = config
        .outbox
        .table("public", "outbox")
        .expect("the outbox table");
    assert_eq!(route.compat, Compat::Debezium);
    assert_eq!(route.topic, "dbz.outbox.event.${aggregate_type}");
    assert_eq!(route.columns.aggregate_id, "aggregateid");
    assert_eq!(
        route.headers,
        [
            ("tenant", "tenant"),
            ("traceparent", "traceparent"),
            ("type", "eventType")
        ]
        .map(|(c, h)| (c.to_owned(), h.to_owned()))
    );
    let notes: Vec<&str> = r.notes.iter().map(|n| n.key.as_str()).collect();
    assert!(notes.contains(&"database.password"), "{notes:?}");
    assert!(notes.contains(&"bootstrap.servers"), "{notes:?}");
}

#[test]
fn the_rest_apis_json_and_a_bare_config_object_give_the_same_configuration() {
    let from_properties = render(PROPERTIES).unwrap().toml;
    assert_eq!(render(&rest_json()).unwrap().toml, from_properties);
    let json: serde_json::Value = serde_json::from_str(&rest_json()).unwrap();
    // GET /connectors/<name> adds the tasks and the type.
    let mut status = json.clone();
    status["tasks"] = serde_json::json!([{"connector": "outbox-connector", "task": 0}]);
    status["type"] = "source".into();
    assert_eq!(render(&status.to_string()).unwrap().toml, from_properties);
    let mut bare = json["config"].clone();
    bare["name"] = "outbox-connector".into();
    assert_eq!(render(&bare.to_string()).unwrap().toml, from_properties);
}

#[test]
fn router_settings_map_to_columns_routing_and_expansion() {
    let text = format!(
        "{PROPERTIES}\n\
         transforms.outbox.table.field.event.id=event_id\n\
         transforms.outbox.table.field.event.key=stream_key\n\
         transforms.outbox.table.field.event.payload=body\n\
         transforms.outbox.table.field.event.timestamp=created_at\n\
         transforms.outbox.route.by.field=category\n\
         transforms.outbox.route.tombstone.on.empty.payload=true\n\
         transforms.outbox.table.op.invalid.behavior=fatal\n\
         transforms.outbox.table.fields.additional.placement=type:header:eventType,shard:partition\n\
         heartbeat.interval.ms=30000\n"
    );
    let r = render(&text).unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    let config = load(&r.toml);
    let route = &config.outbox.tables[0];
    let c = &route.columns;
    assert_eq!(
        (
            c.id.as_str(),
            c.aggregate_id.as_str(),
            c.payload.as_str(),
            c.aggregate_type.as_str()
        ),
        ("event_id", "stream_key", "body", "category")
    );
    assert_eq!(c.timestamp.as_deref(), Some("created_at"));
    assert_eq!(c.partition.as_deref(), Some("shard"));
    assert!(route.tombstones);
    assert_eq!(route.on_change, crate::config::OnChange::FailOnUpdate);
    assert_eq!(
        config.slot.heartbeat_interval,
        Some(std::time::Duration::from_secs(30))
    );
}

#[test]
fn json_converters_and_expansion_are_translated() {
    use crate::config::{Converter, JsonNulls};
    let r = render(&format!(
        "{PROPERTIES}transforms.outbox.table.expand.json.payload=true\n\
         transforms.outbox.table.json.payload.null.behavior=optional_bytes\n\
         key.converter=org.apache.kafka.connect.json.JsonConverter\n\
         key.converter.schemas.enable=false\n\
         value.converter=org.apache.kafka.connect.json.JsonConverter\n\
         value.converter.schemas.enable=true\n\
         field.name.adjustment.mode=none\n"
    ))
    .unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    let config = load(&r.toml);
    let route = &config.outbox.tables[0];
    assert!(route.expand_json_payload);
    assert_eq!(route.json_nulls, JsonNulls::OptionalBytes);
    assert_eq!(
        (route.converters.key, route.converters.value),
        (
            Converter::Json { schemas: false },
            Converter::Json { schemas: true }
        )
    );
    // Expansion under StringConverter writes the struct's toString(), which walbox reproduces.
    let r = render(&format!(
        "{PROPERTIES}transforms.outbox.table.expand.json.payload=true\n"
    ))
    .unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    let route = &load(&r.toml).outbox.tables[0];
    assert!(route.expand_json_payload);
    assert_eq!(route.converters.value, Converter::String);
    // Renamed fields of expanded payloads are not reproduced; a header converter is not either.
    let r = render(&format!(
        "{PROPERTIES}transforms.outbox.table.expand.json.payload=true\n\
         field.name.adjustment.mode=avro\n\
         header.converter=org.apache.kafka.connect.json.JsonConverter\n"
    ))
    .unwrap();
    let refused: Vec<&str> = r.unhonoured.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(refused, ["header.converter", "field.name.adjustment.mode"]);
}

#[test]
fn several_tables_become_outbox_tables_entries() {
    let text = PROPERTIES.replace(
        "table.include.list=public.outbox",
        "table.include.list=public\\\\.outbox,billing.outbox",
    );
    let r = render(&text).unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    let config = load(&r.toml);
    let names: Vec<&str> = config.outbox.tables.iter().map(|t| &*t.name).collect();
    assert_eq!(names, ["public.outbox", "billing.outbox"]);
    assert!(config
        .outbox
        .tables
        .iter()
        .all(|t| t.compat == Compat::Debezium && t.headers.len() == 3));
}

#[test]
fn settings_it_cannot_honour_are_named_with_their_reason() {
    let text = PROPERTIES.replace("plugin.name=pgoutput\n", "").replace(
        "table.include.list=public.outbox",
        "table.include.list=public.outbox_.*",
    ) + "transforms.outbox.route.topic.regex=(?<routedByValue>.*)-(.*)\n\
           transforms.outbox.table.fields.additional.placement=type:envelope:eventType\n\
           slot.drop.on.stop=true\n\
           value.converter=io.confluent.connect.avro.AvroConverter\n\
           column.exclude.list=public.outbox.secret_note\n\
           transforms.outbox.some.future.option=1\n";
    let r = render(&text).unwrap();
    let refused: Vec<&str> = r.unhonoured.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(
        refused,
        [
            "plugin.name",
            "slot.drop.on.stop",
            "table.include.list (entry 1)",
            "transforms.outbox.route.topic.regex",
            "transforms.outbox.some.future.option",
            "transforms.outbox.table.fields.additional.placement (entry 1)",
            "value.converter",
            "column.exclude.list",
        ]
    );
    for f in &r.unhonoured {
        assert!(f.reason.len() > 10, "{f:?} gives no reason");
    }
    assert!(
        r.unhonoured[0].reason.contains("decoderbufs"),
        "{:?}",
        r.unhonoured[0]
    );
    // The partial configuration still loads.
    load(&r.toml);
    assert!(r.toml.contains("# Not honoured: plugin.name"), "{}", r.toml);
}

#[test]
fn the_command_exits_3_on_unhonoured_settings_unless_partial_is_allowed() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(format!("{PROPERTIES}slot.drop.on.stop=true\n").as_bytes())
        .unwrap();
    let e = from_debezium(file.path(), false).unwrap_err();
    assert_eq!(e.failure, Failure::Config);
    assert!(e.message.contains("1 setting(s)"), "{e}");
    assert!(from_debezium(file.path(), true).is_ok());
}

#[test]
fn not_a_postgres_connector_or_without_the_router_is_a_config_error() {
    let mysql = PROPERTIES.replace(
        "io.debezium.connector.postgresql.PostgresConnector",
        "io.debezium.connector.mysql.MySqlConnector",
    );
    let e = render(&mysql).unwrap_err();
    assert!(e.to_string().contains("MySqlConnector"), "{e}");
    let plain_cdc = PROPERTIES.replace("transforms=outbox\n", "");
    let e = render(&plain_cdc).unwrap_err();
    assert!(
        e.to_string().starts_with("transforms: no io.debezium"),
        "{e}"
    );
    let no_host = PROPERTIES.replace("database.hostname=db.internal\n", "");
    let e = render(&no_host).unwrap_err();
    assert_eq!(
        e.to_string(),
        "database.hostname is missing: the connector configuration must name it"
    );
    let bad_slot = PROPERTIES.replace("slot.name=dbz_outbox", "slot.name=Has-Capitals");
    let e = render(&bad_slot).unwrap_err();
    assert!(e.to_string().contains("postgres.slot"), "{e}");
}

#[test]
fn secrets_appear_in_no_output() {
    let secrets = [
        "pg-s3cr3t-value",
        "k4fka-s3cr3t",
        "ssl-s3cr3t",
        "t0ken-s3cr3t",
    ];
    let text = format!(
        "{PROPERTIES}\
         database.sslpassword=ssl-s3cr3t\n\
         producer.override.bootstrap.servers=kafka-1:9093\n\
         producer.override.security.protocol=SASL_SSL\n\
         producer.override.sasl.mechanism=SCRAM-SHA-512\n\
         producer.override.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"walbox\" password=\"k4fka-s3cr3t\";\n\
         producer.override.ssl.truststore.password=ssl-s3cr3t\n\
         some.vendor.api.token=t0ken-s3cr3t\n"
    );
    let r = render(&text).unwrap();
    let mut everything = r.toml.clone();
    for f in r.notes.iter().chain(&r.unhonoured) {
        everything.push_str(&format!("{}: {}\n", f.key, f.reason));
    }
    for secret in secrets {
        assert!(!everything.contains(secret), "{secret} in:\n{everything}");
    }
    let config = load(&r.toml);
    assert_eq!(config.kafka.brokers, "kafka-1:9092", "the environment wins");
    let p = &config.kafka.properties;
    assert_eq!(p.get("sasl.username").map(String::as_str), Some("walbox"));
    assert_eq!(
        p.get("sasl.password").map(String::as_str),
        Some("k4fka-s3cr3t")
    );
    assert!(r.toml.contains(KAFKA_PASSWORD_FILE) && r.toml.contains(PASSWORD_FILE));
    let refused: Vec<&str> = r.unhonoured.iter().map(|f| f.key.as_str()).collect();
    assert!(refused.contains(&"database.sslpassword"), "{refused:?}");
    assert!(refused.contains(&"some.vendor.api.token"), "{refused:?}");
    // A password elsewhere in a line that does not parse is not quoted either.
    for broken in [
        "{\"config\": {\"database.password\": \"pg-s3cr3t-value\"",
        "{\"config\": {\"database.password\": [\"pg-s3cr3t-value\"]}}",
        "database.password=\\uZZZZpg-s3cr3t-value",
    ] {
        let e = render(broken).unwrap_err().to_string();
        assert!(!e.contains("s3cr3t"), "{e}");
    }
}

#[test]
fn a_directory_config_provider_names_the_password_file() {
    let text = PROPERTIES.replace(
        "database.password=pg-s3cr3t-value",
        "database.password=${directory:/run/secrets/debezium:db-password}",
    );
    let r = render(&text).unwrap();
    assert!(
        r.toml
            .contains("password_file = \"/run/secrets/debezium/db-password\""),
        "{}",
        r.toml
    );
    assert!(!r.notes.iter().any(|n| n.key == "database.password"));
    let provided = PROPERTIES.replace(
        "database.hostname=db.internal",
        "database.hostname=${env:DB_HOST}",
    );
    let e = render(&provided).unwrap_err().to_string();
    assert!(
        e.starts_with("database.hostname: is a Connect config provider"),
        "{e}"
    );
}

#[test]
fn properties_are_read_as_java_reads_them() {
    let text = "# comment\n! also a comment\n  key\\ with\\ spaces = a value \\\n    continued\n\
                colon:value\nblank value\nunicode=caf\\u00e9 \\ud83c\\udf89\nescaped=a\\=b\\:c\\\\\n\
                empty=\nlater=1\nlater=2\n";
    let c = ConnectorConfig::parse(text).unwrap();
    let get = |k: &str| c.settings.get(k).map(String::as_str);
    assert_eq!(get("key with spaces"), Some("a value continued"));
    assert_eq!(get("colon"), Some("value"));
    assert_eq!(get("blank"), Some("value"));
    assert_eq!(get("unicode"), Some("caf\u{e9} \u{1f389}"));
    assert_eq!(get("escaped"), Some("a=b:c\\"));
    assert_eq!(get("empty"), Some(""));
    assert_eq!(get("later"), Some("2"));
    assert_eq!(c.settings.len(), 7);
}

#[test]
fn parsers_never_panic_on_garbage() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let alphabet = "{}[]\":,=\\u\n\r\t #!é🎉abc0{\"config\":";
    let chars: Vec<char> = alphabet.chars().collect();
    for _ in 0..3000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 40) as usize;
        let text: String = (0..len)
            .map(|i| chars[((seed >> (i % 50)) as usize + i * 7) % chars.len()])
            .collect();
        let _ = render(&text);
    }
}

#[test]
fn the_routers_missing_field_behaviour_is_its_3_6_key() {
    let r = render(&format!(
        "{PROPERTIES}transforms.outbox.table.field.additional.missing=error\n"
    ))
    .unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    let r = render(&format!(
        "{PROPERTIES}transforms.outbox.table.field.additional.missing=ignore\n"
    ))
    .unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    assert!(r
        .notes
        .iter()
        .any(|n| n.key == "transforms.outbox.table.field.additional.missing"));
    // Not an option of Debezium 3.6's router.
    let r = render(&format!(
        "{PROPERTIES}transforms.outbox.table.fields.additional.error.on.missing=true\n"
    ))
    .unwrap();
    let refused: Vec<&str> = r.unhonoured.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(
        refused,
        ["transforms.outbox.table.fields.additional.error.on.missing"]
    );
}

#[test]
fn binary_data_converter_with_a_string_delegate_is_translated() {
    let binary = "value.converter=io.debezium.converters.BinaryDataConverter\n";
    let delegate =
        "value.converter.delegate.converter.type=org.apache.kafka.connect.storage.StringConverter\n";
    let r = render(&format!("{PROPERTIES}{binary}{delegate}")).unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    load(&r.toml);
    let r = render(&format!("{PROPERTIES}{binary}")).unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    assert!(r
        .notes
        .iter()
        .any(|n| n.key == "value.converter.delegate.converter.type"));
    let r = render(&format!(
        "{PROPERTIES}{binary}value.converter.delegate.converter.type=org.apache.kafka.connect.json.JsonConverter\n\
         binary.handling.mode=base64\n"
    ))
    .unwrap();
    let refused: Vec<&str> = r.unhonoured.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(
        refused,
        [
            "value.converter.delegate.converter.type",
            "binary.handling.mode"
        ]
    );
    // On keys it is not translated: an aggregate id is no bytea.
    let r = render(&format!(
        "{PROPERTIES}key.converter=io.debezium.converters.BinaryDataConverter\n"
    ))
    .unwrap();
    assert_eq!(r.unhonoured[0].key, "key.converter");
}

#[test]
fn producer_overrides_with_a_librdkafka_equivalent_are_translated() {
    // Without overrides: Connect's producer limit, not librdkafka's 1,000,000 bytes.
    let config = load(&render(PROPERTIES).unwrap().toml);
    let p = &config.kafka.properties;
    assert_eq!(
        p.get("message.max.bytes").map(String::as_str),
        Some("1048576")
    );
    let text = format!(
        "{PROPERTIES}\
         producer.override.max.request.size=2097152\n\
         producer.override.compression.type=zstd\n\
         producer.override.linger.ms=20\n\
         producer.override.batch.size=65536\n\
         producer.override.acks=all\n\
         producer.override.enable.idempotence=true\n\
         producer.override.delivery.timeout.ms=120000\n"
    );
    let r = render(&text).unwrap();
    assert!(r.unhonoured.is_empty(), "{:?}", r.unhonoured);
    let config = load(&r.toml);
    let p = &config.kafka.properties;
    for (k, v) in [
        ("message.max.bytes", "2097152"),
        ("compression.type", "zstd"),
        ("linger.ms", "20"),
        ("batch.size", "65536"),
        ("delivery.timeout.ms", "120000"),
    ] {
        assert_eq!(p.get(k).map(String::as_str), Some(v), "{k}");
    }
    // Weaker delivery is refused, by name.
    let r = render(&format!(
        "{PROPERTIES}producer.override.acks=1\nproducer.override.enable.idempotence=false\n"
    ))
    .unwrap();
    let refused: Vec<&str> = r.unhonoured.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(
        refused,
        [
            "producer.override.acks",
            "producer.override.enable.idempotence"
        ]
    );
}
