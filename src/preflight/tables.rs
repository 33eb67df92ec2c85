//! The outbox tables and the publication that carries their rows: each table's mapping (the
//! relay's column checks, then the column types the mapper can read), the role's `SELECT` on
//! it, and the publication, which must exist (or be creatable), publish exactly these tables,
//! and only their INSERTs; with `[outbox.retention]`, what retention needs on each table.

use postgres_protocol::escape::escape_identifier as quote_ident;
use tokio_postgres::Client;

use crate::config::retention::RetentionConfig;
use crate::config::{Config, Route, RouteSource};
use crate::preflight::Check;
use crate::retention::rights::{readiness, Readiness};
use crate::source::catalog::{Publication, TableShape};
use crate::source::standby::Role;

/// The publication check's name.
pub(super) const PUBLICATION: &str = "publication";

/// The name of a table's mapping check.
pub(super) fn table_check(route: &Route) -> String {
    format!("outbox table {}", route.name)
}

/// The name of a table's `SELECT` check.
pub(super) fn select_check(route: &Route) -> String {
    format!("select on {}", route.name)
}

/// The name of a table's retention check.
pub(super) fn retention_name(route: &Route) -> String {
    format!("retention on {}", route.name)
}

/// What `[outbox.retention]` needs on the table (a warning when missing: retention failing
/// never stops the relay, but the table then grows).
pub(super) async fn retention_check(
    client: &Client,
    route: &Route,
    cfg: &RetentionConfig,
) -> Result<Check, tokio_postgres::Error> {
    let name = retention_name(route);
    Ok(match readiness(client, route, cfg).await? {
        Some(Readiness::Ready(what)) => Check::ok(name, what),
        Some(Readiness::Blocked { problems, fixes }) => Check::warn(
            name,
            format!(
                "{}: retention will fail every pass and the table grow",
                problems.join("; ")
            ),
            fixes.join(" "),
        ),
        None => Check::ok(name, "no table: nothing to remove"),
    })
}

/// The table routes with their schema and table.
pub(super) fn tables(config: &Config) -> impl Iterator<Item = (&Route, &str, &str)> {
    config.outbox.tables.iter().filter_map(|r| match &r.source {
        RouteSource::Table { schema, table } => Some((r, schema.as_str(), table.as_str())),
        RouteSource::Messages { .. } => None,
    })
}

/// `schema.table`, quoted for SQL.
pub(super) fn qualified(schema: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

/// The relay's column checks passed; are the types ones the mapper can read?
pub(super) fn mapping_check(route: &Route, table: &str, shape: &TableShape) -> Check {
    let name = table_check(route);
    let c = &route.columns;
    let mut fails = Vec::new();
    let mut warns = Vec::new();
    if let Some(col) = &c.timestamp {
        let ty = shape.column_type(col).unwrap_or_default();
        match ty {
            "timestamp with time zone" | "timestamp without time zone" => {}
            t if is_text(t) => warns.push((
                format!("column {col:?} (outbox.columns.timestamp) is {t}: a value that is not an ISO timestamp rejects its event"),
                format!("ALTER TABLE {table} ALTER COLUMN {} TYPE timestamptz USING {}::timestamptz;", quote_ident(col), quote_ident(col)),
            )),
            t => fails.push((
                format!("column {col:?} (outbox.columns.timestamp) is {t}, not a timestamp: every event would be rejected"),
                format!("set outbox.columns.timestamp to a timestamptz column, or ALTER TABLE {table} ALTER COLUMN {} TYPE timestamptz USING …;", quote_ident(col)),
            )),
        }
    }
    if let Some(col) = &c.partition {
        let ty = shape.column_type(col).unwrap_or_default();
        match ty {
            "smallint" | "integer" => {}
            t if t == "bigint" || t.starts_with("numeric") || is_text(t) => warns.push((
                format!("column {col:?} (outbox.columns.partition) is {t}: a value that is not an integer from 0 to 2147483647 rejects its event"),
                format!("ALTER TABLE {table} ALTER COLUMN {} TYPE integer;", quote_ident(col)),
            )),
            t => fails.push((
                format!("column {col:?} (outbox.columns.partition) is {t}, not an integer: every event would be rejected"),
                format!("set outbox.columns.partition to an integer column, or ALTER TABLE {table} ALTER COLUMN {} TYPE integer USING …;", quote_ident(col)),
            )),
        }
    }
    let join = |v: &[(String, String)]| {
        (
            v.iter()
                .map(|(d, _)| d.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            v.iter()
                .map(|(_, f)| f.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        )
    };
    if !fails.is_empty() {
        fails.extend(warns);
        let (detail, fix) = join(&fails);
        return Check::fail(name, detail, fix);
    }
    if !warns.is_empty() {
        let (detail, fix) = join(&warns);
        return Check::warn(name, detail, fix);
    }
    let payload = shape.column_type(&c.payload).unwrap_or_default();
    Check::ok(
        name,
        format!(
            "{} columns, the mapped ones present (payload {payload}){}",
            shape.columns.len(),
            if shape.partitioned {
                ", partitioned"
            } else {
                ""
            }
        ),
    )
}

fn is_text(t: &str) -> bool {
    t == "text" || t.starts_with("character varying") || t.starts_with("character(")
}

pub(super) async fn select_privilege(
    client: &Client,
    route: &Route,
    schema: &str,
    table: &str,
) -> Result<Check, tokio_postgres::Error> {
    let name = qualified(schema, table);
    let row = client
        .query_one(
            "SELECT has_table_privilege($1::text::regclass, 'SELECT'), current_user::text",
            &[&name],
        )
        .await?;
    let user: String = row.get(1);
    Ok(if row.get::<_, bool>(0) {
        Check::ok(select_check(route), format!("{user} may read it"))
    } else {
        Check::fail(
            select_check(route),
            format!(
                "{user} lacks SELECT on {}: the relay cannot decode its rows",
                route.name
            ),
            format!("GRANT SELECT ON {name} TO {};", quote_ident(&user)),
        )
    })
}

/// Why the role cannot run `CREATE PUBLICATION … FOR TABLE` on the outbox tables found:
/// it needs `CREATE` on the database and to own each table. Empty when it can.
pub(super) async fn creation_rights(
    client: &Client,
    shapes: &[(&Route, &str, &str, bool)],
) -> Result<Vec<String>, tokio_postgres::Error> {
    let mut why = Vec::new();
    let row = client
        .query_one(
            "SELECT current_user::text, has_database_privilege(current_database(), 'CREATE')",
            &[],
        )
        .await?;
    let user: String = row.get(0);
    if !row.get::<_, bool>(1) {
        why.push(format!("{user} lacks CREATE on the database"));
    }
    for (route, schema, table, _) in shapes {
        let owner = client
            .query_one(
                "SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = $1::text::regclass",
                &[&qualified(schema, table)],
            )
            .await?;
        if !owner.get::<_, bool>(0) {
            why.push(format!("{user} does not own {}", route.name));
        }
    }
    Ok(why)
}

/// The publication exists (or will be created), publishes exactly the outbox tables, and only
/// their INSERTs.
pub(super) fn publication_check(
    config: &Config,
    role: Role,
    publication: Option<&Publication>,
    shapes: &[(&Route, &str, &str, bool)],
    cannot_create: Option<&[String]>,
) -> Check {
    let pg = &config.postgres;
    let name = quote_ident(&pg.publication);
    let wanted: Vec<(&str, &str)> = tables(config).map(|(_, s, t)| (s, t)).collect();
    let list = wanted
        .iter()
        .map(|(s, t)| qualified(s, t))
        .collect::<Vec<_>>()
        .join(", ");
    let create_as = |name: &str| {
        if list.is_empty() {
            format!("CREATE PUBLICATION {name} WITH (publish = 'insert');")
        } else {
            format!("CREATE PUBLICATION {name} FOR TABLE {list} WITH (publish = 'insert');")
        }
    };
    let create = create_as(&name);
    let Some(p) = publication else {
        if role == Role::Standby {
            return Check::fail(
                PUBLICATION,
                format!(
                    "publication {:?} does not exist, and the standby cannot create it",
                    pg.publication
                ),
                format!("on the primary: {create}"),
            );
        }
        match cannot_create {
            Some([]) => {
                return Check::ok(
                    PUBLICATION,
                    format!(
                        "{:?} does not exist yet: walbox creates it (postgres.create_publication)",
                        pg.publication
                    ),
                )
            }
            Some(why) => {
                return Check::fail(
                    PUBLICATION,
                    format!(
                        "publication {:?} does not exist, and walbox cannot create it: {}",
                        pg.publication,
                        why.join("; ")
                    ),
                    format!("create it as the tables' owner: {create}"),
                )
            }
            None => {}
        }
        return Check::fail(
            PUBLICATION,
            format!("publication {:?} does not exist", pg.publication),
            format!("{create} (or set postgres.create_publication = true)"),
        );
    };
    if p.all_tables {
        return Check::fail(
            PUBLICATION,
            format!(
                "publication {:?} is FOR ALL TABLES: walbox would decode every table's changes",
                pg.publication
            ),
            format!(
                "create one for the outbox only and set postgres.publication to it: {}",
                create_as(&quote_ident(&format!("{}_outbox", pg.publication)))
            ),
        );
    }
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(s, t)| {
            !p.tables
                .iter()
                .any(|(ps, pt)| ps.as_str() == *s && pt.as_str() == *t)
        })
        .map(|(s, t)| qualified(s, t))
        .collect();
    if !missing.is_empty() {
        problems.push(format!("does not publish {}", missing.join(", ")));
        fixes.push(format!(
            "ALTER PUBLICATION {name} ADD TABLE {};",
            missing.join(", ")
        ));
    }
    let extra: Vec<String> = p
        .tables
        .iter()
        .filter(|(ps, pt)| !wanted.iter().any(|(s, t)| ps == s && pt == t))
        .map(|(s, t)| qualified(s, t))
        .collect();
    if !extra.is_empty() {
        problems.push(format!(
            "also publishes {}, which is not an outbox table",
            extra.join(", ")
        ));
        fixes.push(format!(
            "ALTER PUBLICATION {name} DROP TABLE {};",
            extra.join(", ")
        ));
    }
    let mut also = Vec::new();
    for (published, what) in [
        (p.update, "update"),
        (p.delete, "delete"),
        (p.truncate, "truncate"),
    ] {
        if published {
            also.push(what);
        }
    }
    if !p.insert || !also.is_empty() {
        problems.push(if p.insert {
            format!("publishes {} besides insert", also.join(", "))
        } else {
            "does not publish inserts".to_owned()
        });
        fixes.push(format!(
            "ALTER PUBLICATION {name} SET (publish = 'insert');"
        ));
    }
    if !p.via_root && shapes.iter().any(|s| s.3) {
        problems.push("publishes partitions of a partitioned outbox under their own names".into());
        fixes.push(format!(
            "ALTER PUBLICATION {name} SET (publish_via_partition_root = true);"
        ));
    }
    if !missing.is_empty() || !p.insert {
        // Rows committed while the publication did not cover a table never reach the slot.
        fixes.push(
            "If walbox relayed these tables through its slot before, republish the rows \
             committed meanwhile: walbox republish --since <when the publication stopped \
             covering them>."
                .to_owned(),
        );
    }
    if problems.is_empty() {
        Check::ok(
            PUBLICATION,
            format!(
                "{:?} publishes the outbox tables' inserts only",
                pg.publication
            ),
        )
    } else {
        Check::fail(
            PUBLICATION,
            format!("publication {:?} {}", pg.publication, problems.join("; ")),
            fixes.join(" "),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_types() {
        assert!(is_text("character varying(20)"));
        assert!(is_text("text"));
        assert!(!is_text("jsonb"));
    }
}
