//! What the end-to-end benches share around their measurements: `main` under `cargo bench`
//! (and nothing under `cargo test --all-targets`, which runs bench targets without `--bench`),
//! and their `WALBOX_BENCH_*` settings read from the environment (blank counts as unset).

use std::future::Future;
use std::process::ExitCode;
use std::str::FromStr;

use anyhow::Context;

/// Runs `run` on a two-worker runtime when the arguments hold `--bench`; otherwise says how to
/// run bench `name` and succeeds.
pub fn main_with<F>(name: &str, run: impl FnOnce() -> F) -> ExitCode
where
    F: Future<Output = anyhow::Result<()>>,
{
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "{name} bench: run it with `cargo bench --bench {name}` (skipped under cargo test)"
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name} bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name} bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The variable `k`, unless unset or blank.
pub fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// The number in `k` (`_` and `,` allowed as separators), else `default`.
pub fn num<T: FromStr>(k: &str, default: T) -> anyhow::Result<T> {
    var(k).map_or(Ok(default), |v| {
        v.replace(['_', ','], "")
            .parse()
            .map_err(|_| anyhow::anyhow!("{k}={v}: not a number"))
    })
}

/// `NAME=value` assignments separated by `;` in variable `k` (none when unset). Only the
/// benches that take such settings call it (debezium, brokers).
#[allow(dead_code)]
pub fn assignments(k: &str) -> anyhow::Result<Vec<(String, String)>> {
    var(k)
        .map(|v| {
            v.split(';')
                .filter(|a| !a.trim().is_empty())
                .map(|a| {
                    a.split_once('=')
                        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                        .with_context(|| format!("{k}: {a:?} is not NAME=VALUE"))
                })
                .collect()
        })
        .unwrap_or(Ok(Vec::new()))
}

/// The comma-separated list in `k`, else `default`.
pub fn list<T: FromStr>(k: &str, default: Vec<T>) -> anyhow::Result<Vec<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match var(k) {
        Some(v) => v
            .split(',')
            .map(|r| r.trim().parse::<T>().with_context(|| format!("{k}={v}")))
            .collect(),
        None => Ok(default),
    }
}

/// Prints bench `name`'s result `table` and writes it to `output`.
pub fn publish(name: &str, output: &std::path::Path, table: &str) -> anyhow::Result<()> {
    println!("\n{table}");
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(output, table).with_context(|| format!("writing {}", output.display()))?;
    eprintln!("{name} bench: table written to {}", output.display());
    Ok(())
}

/// A throwaway PostgreSQL cluster with `settings`, stopped by its watchdog if the bench dies,
/// with the database `bench` set up by each of `sql` in turn.
pub async fn bench_cluster(
    settings: &[(&str, &str)],
    sql: &[&str],
) -> anyhow::Result<walbox::sandbox::postgres::PgCluster> {
    use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};
    let options = PgClusterOptions {
        settings: settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        watchdog: true,
        ..Default::default()
    };
    let cluster = tokio::task::spawn_blocking(|| PgCluster::start(options))
        .await?
        .context("starting PostgreSQL")?;
    cluster.create_database("bench")?;
    for s in sql {
        cluster.psql("bench", s)?;
    }
    Ok(cluster)
}
