//! The shipped deployment artifacts, checked without a container engine: the compose stack
//! (`deploy/compose.yaml`) references only files that exist, wires its services together
//! (Prometheus scrapes the ports walbox and the inbox listen on, Grafana loads the dashboard,
//! PostgreSQL has logical decoding and a slot WAL limit), walbox and the inbox accept their
//! configuration, Prometheus accepts its own (`promtool check config`), and every query of the
//! Grafana dashboard (`deploy/grafana/walbox.json`) is valid PromQL (`promtool check rules`) on
//! metrics walbox really exports. `stack.rs` runs the stack itself, without containers.

mod stack;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

pub(crate) fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut docs =
        YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(docs.len(), 1, "{}: one YAML document", path.display());
    docs.remove(0)
}

fn compose() -> Yaml {
    yaml(&deploy().join("compose.yaml"))
}

fn services(compose: &Yaml) -> Vec<(String, &Yaml)> {
    compose["services"]
        .as_hash()
        .expect("compose.yaml has services")
        .iter()
        .map(|(k, v)| (k.as_str().expect("service name").to_owned(), v))
        .collect()
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .map(|s| match s {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    other => panic!("expected a string, got {other:?}"),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `source:target[:mode]` bind mounts of a service (named volumes are skipped), as
/// (host path relative to deploy/, path in the container).
fn bind_mounts(service: &Yaml) -> Vec<(PathBuf, String)> {
    strings(&service["volumes"])
        .into_iter()
        .filter(|v| v.starts_with('.') || v.starts_with('/'))
        .map(|v| {
            let mut parts = v.split(':');
            let source = parts.next().unwrap_or_default();
            let target = parts.next().unwrap_or_else(|| panic!("{v}: no target"));
            (deploy().join(source), target.to_owned())
        })
        .collect()
}

/// The host file mounted at `target` in `service`.
fn mounted_at(service: &Yaml, target: &str) -> PathBuf {
    bind_mounts(service)
        .into_iter()
        .find_map(|(source, t)| (t == target).then_some(source))
        .unwrap_or_else(|| panic!("nothing is mounted at {target}"))
        .canonicalize()
        .unwrap_or_else(|e| panic!("the file mounted at {target}: {e}"))
}

#[test]
fn compose_references_only_files_that_exist() {
    let compose = compose();
    let declared_volumes: BTreeSet<String> = compose["volumes"]
        .as_hash()
        .map(|h| {
            h.keys()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let mut checked = BTreeSet::new();
    for (name, service) in services(&compose) {
        for volume in strings(&service["volumes"]) {
            let source = volume.split(':').next().unwrap_or_default();
            if !(source.starts_with('.') || source.starts_with('/')) {
                assert!(
                    declared_volumes.contains(source),
                    "service {name}: named volume {source} is not declared under volumes:"
                );
            }
        }
        for (source, _) in bind_mounts(service) {
            assert!(
                source.exists(),
                "service {name} mounts {}, which does not exist",
                source.display()
            );
            checked.insert(source.canonicalize().unwrap());
        }
        if let Some(context) = service["build"]["context"].as_str() {
            let context = deploy().join(context);
            let dockerfile = context.join(
                service["build"]["dockerfile"]
                    .as_str()
                    .unwrap_or("Dockerfile"),
            );
            assert!(
                dockerfile.is_file(),
                "service {name}: no {}",
                dockerfile.display()
            );
            assert!(
                context.join("Cargo.lock").is_file(),
                "service {name}: the build context is not the repository"
            );
            checked.insert(dockerfile.canonicalize().unwrap());
        }
        for dependency in service["depends_on"]
            .as_hash()
            .into_iter()
            .flat_map(|h| h.keys())
        {
            let dependency = dependency.as_str().unwrap();
            assert!(
                !compose["services"][dependency].is_badvalue(),
                "service {name} depends on {dependency}, which is not a service"
            );
        }
    }
    // The files the stack is made of; a mount that silently stopped matching one of them
    // would leave the check above with nothing to check.
    for file in [
        "compose/postgres-init.sh",
        "compose/kafka-topics.sh",
        "compose/walbox.toml",
        "compose/inbox.toml",
        "compose/writer.sql",
        "prometheus/prometheus.yml",
        "prometheus/alerts.yml",
        "grafana/walbox.json",
        "grafana/provisioning/datasources/prometheus.yml",
        "grafana/provisioning/dashboards/walbox.yml",
        "Dockerfile",
        "../migrations",
    ] {
        let path = deploy().join(file).canonicalize().unwrap();
        assert!(
            checked.contains(&path),
            "the compose stack does not use deploy/{file}"
        );
    }
}

#[test]
fn compose_images_are_pinned_and_postgres_decodes_logically() {
    let compose = compose();
    for (name, service) in services(&compose) {
        let Some(image) = service["image"].as_str() else {
            continue;
        };
        let tag = image.rsplit_once(':').map(|(_, tag)| tag);
        assert!(
            matches!(tag, Some(t) if t != "latest" && !t.contains('/')),
            "service {name}: image {image} is not pinned to a tag"
        );
    }
    let postgres = strings(&compose["services"]["postgres"]["command"]).join(" ");
    assert!(postgres.contains("wal_level=logical"), "{postgres}");
    assert!(postgres.contains("max_slot_wal_keep_size="), "{postgres}");
    let kafka = &compose["services"]["kafka"]["environment"];
    assert_eq!(
        kafka["KAFKA_PROCESS_ROLES"].as_str(),
        Some("broker,controller"),
        "KRaft, one node"
    );
    // The init script applies the migrations from the mounted directory.
    let init = std::fs::read_to_string(deploy().join("compose/postgres-init.sh")).unwrap();
    assert!(init.contains("migrations=${MIGRATIONS_DIR:-/walbox/migrations}"));
    for migration in ["outbox.sql", "inbox.sql"] {
        assert!(
            init.contains(&format!("-f \"$migrations/{migration}\"")),
            "{migration} not applied"
        );
    }
    assert_eq!(
        mounted_at(&compose["services"]["postgres"], "/walbox/migrations"),
        deploy().join("../migrations").canonicalize().unwrap()
    );
}

/// The configuration file a walbox service runs with: its `--config` argument, mounted.
fn service_config(service: &Yaml) -> PathBuf {
    let command = strings(&service["command"]);
    let at = command
        .iter()
        .position(|a| a == "--config")
        .expect("--config");
    mounted_at(service, &command[at + 1])
}

#[test]
fn walbox_and_the_inbox_accept_their_compose_configuration_and_prometheus_scrapes_them() {
    let compose = compose();
    let relay = walbox::config::load_from(
        Some(&service_config(&compose["services"]["walbox"])),
        &mut std::iter::empty(),
    )
    .unwrap_or_else(|e| panic!("compose/walbox.toml: {e}"));
    let inbox = walbox::inbox::config::load_from(
        Some(&service_config(&compose["services"]["inbox"])),
        &mut std::iter::empty(),
    )
    .unwrap_or_else(|e| panic!("compose/inbox.toml: {e}"));

    let prometheus = yaml(&mounted_at(
        &compose["services"]["prometheus"],
        "/etc/prometheus/prometheus.yml",
    ));
    let mut targets = BTreeMap::new();
    for job in prometheus["scrape_configs"].as_vec().unwrap() {
        let job_name = job["job_name"].as_str().unwrap().to_owned();
        for config in job["static_configs"].as_vec().unwrap() {
            for target in strings(&config["targets"]) {
                targets.insert(target, job_name.clone());
            }
        }
    }
    let relay_port = relay.http_listen.expect("walbox serves /metrics").port();
    let inbox_port = inbox.http_listen.expect("the inbox serves /metrics").port();
    // The alert rules select job="walbox".
    assert_eq!(
        targets
            .get(&format!("walbox:{relay_port}"))
            .map(String::as_str),
        Some("walbox"),
        "{targets:?}"
    );
    assert!(
        targets.contains_key(&format!("inbox:{inbox_port}")),
        "{targets:?}"
    );
    // Every rule file Prometheus loads is mounted beside its configuration.
    let service = &compose["services"]["prometheus"];
    for rules in strings(&prometheus["rule_files"]) {
        let mounted = mounted_at(service, &format!("/etc/prometheus/{rules}"));
        assert_eq!(
            mounted,
            deploy()
                .join("prometheus")
                .join(&rules)
                .canonicalize()
                .unwrap()
        );
    }
}

fn promtool(args: &[&str], dir: &Path) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool not found: install it with scripts/install-deps.sh (Debian package prometheus)");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn prometheus_config_passes_promtool() {
    promtool(
        &["check", "config", "prometheus.yml"],
        &deploy().join("prometheus"),
    );
}

pub(crate) fn dashboard() -> Value {
    let path = deploy().join("grafana/walbox.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        out.push(panel);
        out.extend(panel["panels"].as_array().into_iter().flatten());
    }
    out
}

/// (panel title, expr) of every query.
pub(crate) fn queries(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            p["targets"].as_array().into_iter().flatten().map(move |t| {
                let expr = t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{title}: a target without expr"));
                (title.clone(), expr.to_owned())
            })
        })
        .collect()
}

/// The series names an exposition holds.
pub(crate) fn exposition_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

/// Every series name walbox run and walbox inbox export, the optional ones included.
fn exported_names() -> BTreeSet<String> {
    let relay = walbox::metrics::Metrics::new();
    for gauge in [
        &relay.slot_safe_wal_size,
        &relay.slot_max_wal_keep,
        &relay.slot_keep_used_ratio,
        &relay.slot_failover,
        &relay.slot_synced,
        &relay.slot_idle_timeout,
        &relay.slot_spilled,
    ] {
        gauge.set(Some(1.0));
    }
    for status in walbox::metrics::WAL_STATUSES {
        relay.slot_wal_status.with_label_values(&[status]).set(0);
    }
    for counter in [
        &relay.retention_rows_deleted,
        &relay.retention_partitions_dropped,
        &relay.retention_partitions_created,
        &relay.retention_errors,
    ] {
        counter.with_label_values(&["public.outbox"]).inc();
    }
    relay
        .retention_last_success
        .with_label_values(&["public.outbox"])
        .set(1.0);
    let inbox = walbox::inbox::metrics::InboxMetrics::new();
    let mut names = exposition_names(&relay.render());
    names.extend(exposition_names(&inbox.render()));
    names
}

/// The metric names a PromQL expression selects: identifiers outside label matchers, ranges
/// and strings that are not functions, aggregations, grouping labels or keywords.
pub(crate) fn metric_names(expr: &str) -> BTreeSet<String> {
    // Binary operators, and aggregations (which may precede `by (…)` rather than `(`).
    const KEYWORDS: [&str; 18] = [
        "bool",
        "and",
        "or",
        "unless",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    let bytes = expr.as_bytes();
    let mut names = BTreeSet::new();
    let (mut i, mut depth_braces, mut depth_brackets) = (0, 0, 0);
    let mut grouping = false;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'"' | b'\'' => {
                i += 1;
                while i < bytes.len() && bytes[i] != c {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'{' => (depth_braces, i) = (depth_braces + 1, i + 1),
            b'}' => (depth_braces, i) = (depth_braces - 1, i + 1),
            b'[' => (depth_brackets, i) = (depth_brackets + 1, i + 1),
            b']' => (depth_brackets, i) = (depth_brackets - 1, i + 1),
            b')' => (grouping, i) = (false, i + 1),
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || b"_:".contains(&bytes[i]))
                {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = expr[i..].trim_start().as_bytes().first().copied();
                if matches!(
                    word,
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    grouping = true;
                } else if depth_braces == 0
                    && depth_brackets == 0
                    && !grouping
                    && next != Some(b'(')
                    && !KEYWORDS.contains(&word)
                {
                    names.insert(word.to_owned());
                }
            }
            b'$' => {
                // A Grafana variable ($__rate_interval): not PromQL.
                i += 1;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn the_metric_name_extraction_sees_selectors_only() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le) (rate(walbox_x_bucket{status="a b"}[$__rate_interval]))) / ignoring (job) walbox_y and on() up"#,
    );
    assert_eq!(
        names,
        ["up", "walbox_x_bucket", "walbox_y"]
            .map(String::from)
            .into()
    );
}

#[test]
fn dashboard_queries_name_only_metrics_walbox_exports() {
    let dashboard = dashboard();
    let exported = exported_names();
    let queries = queries(&dashboard);
    let mut used = BTreeSet::new();
    for (title, expr) in &queries {
        let names = metric_names(expr);
        assert!(
            !names.is_empty(),
            "panel {title:?}: {expr} selects no metric"
        );
        for name in names {
            assert!(
                exported.contains(&name),
                "panel {title:?}: {expr} queries {name}, which walbox does not export"
            );
            used.insert(name);
        }
    }
    // What an operator needs to see (docs/operations.md's metrics table; docs/inbox.md).
    for needed in [
        "walbox_events_published_total",
        "walbox_commit_to_ack_seconds_bucket",
        "walbox_inflight_events",
        "walbox_slot_retained_wal_bytes",
        "walbox_slot_max_wal_keep_bytes",
        "walbox_slot_alert_level",
        "walbox_slot_wal_status",
        "walbox_replication_lag_seconds",
        "walbox_dead_letter_total",
        "walbox_outbox_retention_rows_deleted_total",
        "walbox_outbox_retention_partitions_dropped_total",
        "walbox_outbox_retention_errors_total",
        "walbox_outbox_retention_last_success_timestamp_seconds",
        "walbox_inbox_records_consumed_total",
        "walbox_inbox_consumer_lag_records",
        "walbox_inbox_dead_lettered_total",
        "walbox_inbox_effect_errors_total",
    ] {
        assert!(used.contains(needed), "no dashboard panel shows {needed}");
    }
}

#[test]
fn dashboard_queries_are_valid_promql() {
    let dashboard = dashboard();
    // Each query as a recording rule: `promtool check rules` parses it. Grafana's interval
    // variables become a literal duration.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let queries = queries(&dashboard);
    for (i, (_, expr)) in queries.iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "1m")
            .replace("$__interval", "1m");
        rules += &format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard.yml"), rules).unwrap();
    promtool(&["check", "rules", "dashboard.yml"], dir.path());
}

#[test]
fn dashboard_panels_use_the_provisioned_data_source_and_do_not_overlap() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "walbox");
    let variable = dashboard["templating"]["list"]
        .as_array()
        .and_then(|l| l.iter().find(|v| v["name"] == "datasource"))
        .expect("a datasource variable");
    assert_eq!(variable["type"], "datasource");
    assert_eq!(variable["query"], "prometheus");
    let provisioned = yaml(&deploy().join("grafana/provisioning/datasources/prometheus.yml"));
    let source = &provisioned["datasources"][0];
    assert_eq!(source["type"].as_str(), Some("prometheus"));
    assert_eq!(
        variable["current"]["value"].as_str(),
        source["uid"].as_str()
    );
    assert!(source["url"]
        .as_str()
        .unwrap()
        .starts_with("http://prometheus:"));

    let mut ids = BTreeSet::new();
    let mut cells = BTreeMap::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "{title}: duplicate id"
        );
        if panel["type"] != "row" {
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
            for target in panel["targets"].as_array().expect("targets") {
                assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            }
        }
        let g = &panel["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24 && w > 0 && h > 0, "{title}: gridPos {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), title.to_owned()) {
                    panic!("panels {other:?} and {title:?} overlap");
                }
            }
        }
    }
    // The provider loads the directory the dashboard is mounted in.
    let provider = yaml(&deploy().join("grafana/provisioning/dashboards/walbox.yml"));
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let grafana = &compose()["services"]["grafana"];
    assert_eq!(
        mounted_at(grafana, &format!("{path}/walbox.json")),
        deploy().join("grafana/walbox.json").canonicalize().unwrap()
    );
}
