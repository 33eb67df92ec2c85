//! `[redis]` and `[rabbitmq]` through the whole loader: the section names the broker, its
//! password comes from a file, and `[kafka]` beside it is refused. (Beside `config_tests.rs`,
//! not in the sections' files: a section's file may not import the loader that imports it.)

use crate::config::fixture::{env, file};
use crate::config::secret::Secret;
use crate::config::{load_from, BrokerConfig};

/// `[redis]` in a whole document: it names the broker, takes its password from a file, and
/// refuses `kafka.brokers` beside it.
#[test]
fn a_redis_section_makes_redis_the_broker() {
    let secret = file("s3cret\n");
    let path = secret.path().display().to_string();
    let doc = file("[postgres]\nurl = \"postgres://walbox@db/app\"\n[redis]\nurl = \"redis://r:6379/1\"\nuser = \"walbox\"\n");
    let c = load_from(
        Some(doc.path()),
        &mut env(&[
            ("WALBOX_REDIS_PASSWORD_FILE", &path),
            ("WALBOX_REDIS_MAXLEN", "1000"),
        ])
        .into_iter(),
    )
    .unwrap();
    let BrokerConfig::Redis(r) = &c.broker else {
        panic!("{:?}", c.broker)
    };
    assert_eq!(r.password.as_ref().map(Secret::expose), Some("s3cret"));
    assert_eq!(r.maxlen, Some(1000));
    assert!(!format!("{c:?}").contains("s3cret"));
    let e = load_from(
        Some(doc.path()),
        &mut env(&[
            ("WALBOX_KAFKA_BROKERS", "k:9092"),
            ("WALBOX_REDIS_PASSWORD", "s3cret"),
        ])
        .into_iter(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("[redis] and [kafka] both configured"), "{e}");
}

#[test]
fn a_rabbitmq_section_makes_it_the_broker_with_the_password_from_a_file() {
    let secret = file("s3cret\n");
    let f = file(&format!(
        "[postgres]\nurl = \"postgres://walbox@db/app\"\n[rabbitmq]\nurl = \"amqp://walbox@mq:5672/%2f\"\npassword_file = {:?}\n",
        secret.path().display().to_string()
    ));
    let c = load_from(Some(f.path()), &mut std::iter::empty()).unwrap();
    let BrokerConfig::RabbitMq(r) = &c.broker else {
        panic!("not rabbitmq: {:?}", c.broker)
    };
    assert_eq!(r.password.as_ref().map(Secret::expose), Some("s3cret"));
    let c = load_from(
        Some(f.path()),
        &mut env(&[("WALBOX_RABBITMQ_EXCHANGE", "events")]).into_iter(),
    )
    .unwrap();
    let BrokerConfig::RabbitMq(r) = &c.broker else {
        panic!("not rabbitmq")
    };
    assert_eq!(r.exchange, "events");
    let both = file(
        "[postgres]\nurl = \"postgres://walbox@db/app\"\n[kafka]\nbrokers = \"k:9092\"\n[rabbitmq]\nurl = \"amqp://walbox@mq\"\n",
    );
    let e = load_from(Some(both.path()), &mut std::iter::empty()).unwrap_err();
    assert!(e.to_string().contains("[rabbitmq] and [kafka]"), "{e}");
}
