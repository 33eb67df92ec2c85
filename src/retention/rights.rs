//! What retention needs of the role, for `walbox check`: read with the passes' own layout
//! detection ([`super::partitions::layout`], [`super::rows::leaves`]), so the check and the
//! passes cannot disagree about which form a table gets.
//!
//! - Row batches: `SELECT` and `DELETE` on the table, and on each leaf partition of a
//!   partitioned table (a batch names the leaf, and PostgreSQL checks the leaf's own
//!   privileges then).
//! - Partitions: owning the table (`CREATE TABLE … PARTITION OF`, `DROP TABLE` of a partition)
//!   and `CREATE` on its schema; `SELECT` and `DELETE` on the default partition.
//! - The time column exists and holds times (`timestamptz`, `timestamp` or `date`).

use tokio_postgres::Client;

use super::{partitions, quote, rows, Target};
use crate::config::retention::RetentionConfig;
use crate::config::Route;

/// Whether retention can do its work on one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// It can: what it will do.
    Ready(String),
    /// It cannot: each problem, and the statements (or settings) that fix them.
    Blocked {
        /// What is missing.
        problems: Vec<String>,
        /// How to fix it.
        fixes: Vec<String>,
    },
}

/// Reads what retention needs on `route`'s table; `None` for the table-less route.
pub async fn readiness(
    client: &Client,
    route: &Route,
    cfg: &RetentionConfig,
) -> Result<Option<Readiness>, tokio_postgres::Error> {
    let Some(target) = Target::of(route, cfg) else {
        return Ok(None);
    };
    let row = client
        .query_one(
            "SELECT current_user::text, \
                    (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
                     WHERE a.attrelid = $1::text::regclass AND a.attname = $2 \
                       AND a.attnum > 0 AND NOT a.attisdropped)",
            &[&target.qualified, &target.column],
        )
        .await?;
    let (user, column_type): (String, Option<String>) = (row.get(0), row.get(1));
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    match column_type.as_deref() {
        Some("timestamp with time zone" | "timestamp without time zone" | "date") => {}
        Some(other) => {
            problems.push(format!("column {:?} is {other}, not a time", target.column));
            fixes.push("set outbox.retention.column to the rows' insert time".to_owned());
        }
        None => {
            problems.push(format!(
                "{} has no column {:?}",
                target.label, target.column
            ));
            fixes.push("set outbox.retention.column to the rows' insert time".to_owned());
        }
    }
    let partitioned = partitions::layout(client, &target).await?.is_some();
    let batches = if partitioned {
        let row = client
            .query_one(
                "SELECT pg_has_role(c.relowner, 'USAGE'), has_schema_privilege(c.relnamespace, 'CREATE') \
                 FROM pg_class c WHERE c.oid = $1::text::regclass",
                &[&target.qualified],
            )
            .await?;
        if !row.get::<_, bool>(0) {
            problems.push(format!(
                "{user} does not own {}: it cannot create or drop partitions",
                target.label
            ));
            fixes.push(format!(
                "ALTER TABLE {} OWNER TO {};",
                target.qualified,
                quote(&user)
            ));
        }
        if !row.get::<_, bool>(1) {
            problems.push(format!("{user} lacks CREATE on schema {}", target.schema));
            fixes.push(format!(
                "GRANT CREATE ON SCHEMA {} TO {};",
                quote(&target.schema),
                quote(&user)
            ));
        }
        let default: Option<String> = client
            .query_one(
                "SELECT (SELECT c.oid::regclass::text FROM pg_inherits i \
                         JOIN pg_class c ON c.oid = i.inhrelid \
                         WHERE i.inhparent = $1::text::regclass \
                           AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT')",
                &[&target.qualified],
            )
            .await?
            .get(0);
        match default {
            Some(d) => rows::leaves(client, &d).await?,
            None => Vec::new(),
        }
    } else {
        rows::leaves(client, &target.qualified).await?
    };
    let mut short = Vec::new();
    for relation in &batches {
        let row = client
            .query_one(
                "SELECT has_table_privilege($1::text::regclass, 'SELECT') \
                    AND has_table_privilege($1::text::regclass, 'DELETE')",
                &[relation],
            )
            .await?;
        if !row.get::<_, bool>(0) {
            short.push(relation.clone());
        }
    }
    if !short.is_empty() {
        problems.push(format!(
            "{user} lacks SELECT or DELETE on {}",
            short.join(", ")
        ));
        fixes.push(format!(
            "GRANT SELECT, DELETE ON {} TO {};",
            short.join(", "),
            quote(&user)
        ));
    }
    if !problems.is_empty() {
        return Ok(Some(Readiness::Blocked { problems, fixes }));
    }
    let keep = whole_unit(cfg.keep.as_secs());
    Ok(Some(Readiness::Ready(if partitioned {
        format!(
            "partitioned by range on {:?}: {user} drops partitions older than {keep} and creates {} ahead",
            target.column, cfg.premake
        )
    } else {
        format!(
            "{user} deletes rows older than {keep} in batches of {}",
            cfg.batch_size
        )
    })))
}

/// `keep` as the largest whole unit (`7d`, `36h`, `90m`, `45s`).
fn whole_unit(secs: u64) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::whole_unit;

    #[test]
    fn keep_is_shown_in_its_largest_whole_unit() {
        assert_eq!(whole_unit(7 * 86_400), "7d");
        assert_eq!(whole_unit(36 * 3600), "36h");
        assert_eq!(whole_unit(90 * 60), "90m");
        assert_eq!(whole_unit(61), "61s");
    }
}
