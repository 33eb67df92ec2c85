//! The `walbox` binary: parse the command line, load configuration, set up logging, run. Every
//! command that reads a configuration file starts through [`with_config`].

use std::future::Future;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use walbox::cli::{Cli, Command, WindowArgs};
use walbox::cmd::republish::Window;
use walbox::config::{self, Config, ConfigError, LogConfig, LogFormat};
use walbox::failure::{Failure, FatalError};
use walbox::inbox::config::InboxConfig;

fn init_logging(format: LogFormat, level: &str) {
    let mut filter = EnvFilter::try_from_env("WALBOX_LOG")
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // lapin (RabbitMQ) logs at ERROR what walbox expects and reports itself: a progress queue
    // not there yet (a passive declare refused), a connection the node closed. Its lines are
    // shown only when the filter names it.
    let named = std::env::var("WALBOX_LOG").unwrap_or_else(|_| level.to_owned());
    if !named.contains("lapin") {
        if let Ok(off) = "lapin=off".parse() {
            filter = filter.add_directive(off);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Resolves on SIGTERM or SIGINT. SIGHUP (which would otherwise end the process at once) is
/// logged and ignored: walbox reads its configuration only at start.
///
/// The handlers are installed by this call, not when the future is first polled: a signal sent
/// any time after it (a test that stops walbox as soon as it logs, say) is never met by the
/// default action. Call it inside the runtime (within the command's future).
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int), Ok(mut hup)) => loop {
                tokio::select! {
                    _ = term.recv() => break,
                    _ = int.recv() => break,
                    _ = hup.recv() => tracing::warn!(
                        "SIGHUP ignored: walbox does not reload its configuration; restart it \
                         (SIGTERM, then start) to apply a change"
                    ),
                }
            },
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// Prints `e` on the `walbox: error:` line; its failure's status.
fn fail(e: FatalError) -> ExitCode {
    eprintln!("walbox: error: {e}");
    ExitCode::from(e.failure.exit_code())
}

/// The exit status of a finished service (`run`, `inbox`); its fatal error is also logged for
/// log collectors.
fn finish(what: &str, result: Result<(), FatalError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, exit_status = e.failure.exit_code(), "{what} stopped");
            fail(e)
        }
    }
}

/// The exit status of a finished one-shot command: its fatal error is printed once, on the
/// `walbox: error:` line (its operator reads stderr, not a log collector).
fn finish_once(result: Result<(), FatalError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// A multi-threaded runtime with `workers` worker threads.
fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
}

/// Runs `task` to completion on a runtime of 2 worker threads (the command's own thread drives
/// it).
fn block_on<T>(task: impl Future<Output = Result<T, FatalError>>) -> Result<T, FatalError> {
    runtime(2).map_err(runtime_failed)?.block_on(task)
}

/// Runs `task` to completion on a worker thread of a runtime of `workers` worker threads, like
/// the tasks it talks to (the main thread is not a worker).
fn spawn_on<T: Send + 'static>(
    workers: usize,
    what: &str,
    task: impl Future<Output = Result<T, FatalError>> + Send + 'static,
) -> Result<T, FatalError> {
    let runtime = runtime(workers).map_err(runtime_failed)?;
    let task = runtime.spawn(task);
    runtime.block_on(task).unwrap_or_else(|e| {
        Err(FatalError::new(
            Failure::Internal,
            format!("{what} task failed: {e}"),
        ))
    })
}

fn runtime_failed(e: std::io::Error) -> FatalError {
    FatalError::new(Failure::Internal, format!("cannot start runtime: {e}"))
}

/// Worker threads for `walbox run`: 2 (measured best for one relay: fewer cross-thread
/// wake-ups), one more per further shard, at most the machine's cores.
fn shard_workers(shards: u32) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (shards as usize + 1).min(cores).max(2)
}

/// How a command that reads a configuration file reports.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reports {
    /// A service, or `reshard`: logs at `log.level`.
    Log,
    /// A one-shot command: logs only warnings (its operator reads its output).
    Output,
    /// `walbox check --json`: as [`Reports::Output`], and a configuration that cannot be
    /// loaded is still a JSON report on stdout.
    JsonReport,
}

/// The one way a command starts from its configuration file: loaded from `path` (or the
/// environment alone; one that cannot be loaded is printed on the `walbox: error:` line with its
/// exit status, 3), logging set up from its `[log]` as `reports` says, then `command` run on it.
fn with_config<C: ConfigFile>(
    path: Option<PathBuf>,
    reports: Reports,
    command: impl FnOnce(C) -> ExitCode,
) -> ExitCode {
    let config = match C::load(path.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            if reports == Reports::JsonReport {
                let report = walbox::cmd::check::unloadable_config_json(&e.to_string());
                println!("{report:#}");
            }
            return fail(FatalError::of(&e));
        }
    };
    let log = config.log();
    match reports {
        Reports::Log => init_logging(log.format, &log.level),
        Reports::Output | Reports::JsonReport => init_logging(log.format, "warn"),
    }
    command(config)
}

/// A configuration file: walbox.toml (`WALBOX_*`) or inbox.toml (`WALBOX_INBOX_*`).
trait ConfigFile: Sized {
    fn load(path: Option<&Path>) -> Result<Self, ConfigError>;
    fn log(&self) -> &LogConfig;
}

impl ConfigFile for Config {
    fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        config::load(path)
    }
    fn log(&self) -> &LogConfig {
        &self.log
    }
}

impl ConfigFile for InboxConfig {
    fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        walbox::inbox::load(path)
    }
    fn log(&self) -> &LogConfig {
        &self.log
    }
}

/// The rows `republish` and `audit` take.
fn window(args: WindowArgs) -> Window {
    Window {
        since_id: args.since_id,
        since: args.since,
        time_column: args.time_column,
    }
}

/// `recreate-slot` without `--confirm-data-loss`.
const UNCONFIRMED_DATA_LOSS: &str = "recreate-slot skips every event committed while the slot \
     was lost; pass --confirm-data-loss to proceed";

fn main() -> ExitCode {
    let cli = Cli::parse();
    #[cfg(feature = "failpoints")]
    let _faults = walbox::fault::setup();
    match cli.command {
        Command::Run { file } => with_config(file.config, Reports::Log, |config: Config| {
            // Shards relay side by side: a worker per shard, up to the machine's cores.
            let workers = shard_workers(config.postgres.shards);
            let relay = async move { walbox::app::run(config, shutdown_signal()).await };
            finish("walbox", spawn_on(workers, "relay", relay))
        }),
        Command::Status { file, output } => {
            with_config(file.config, Reports::Output, |c: Config| {
                finish_once(block_on(walbox::cmd::status::status(&c, output.json)))
            })
        }
        Command::Check { file, output } => {
            let reports = match output.json {
                true => Reports::JsonReport,
                false => Reports::Output,
            };
            // A failed check is the report's news, already printed: not an error to log.
            with_config(file.config, reports, |c: Config| {
                finish_once(block_on(walbox::cmd::check::check(&c, output.json)))
            })
        }
        Command::RecreateSlot {
            confirm_data_loss: false,
            ..
        } => fail(FatalError::new(Failure::Config, UNCONFIRMED_DATA_LOSS)),
        Command::RecreateSlot { file, .. } => {
            with_config(file.config, Reports::Output, |c: Config| {
                finish_once(block_on(walbox::cmd::recreate_slot::recreate_slot(&c)))
            })
        }
        Command::Reshard { file, to } => with_config(file.config, Reports::Log, |c: Config| {
            let reshard =
                async move { walbox::cmd::reshard::reshard(&c, to, shutdown_signal()).await };
            finish_once(spawn_on(2, "reshard", reshard))
        }),
        Command::Republish {
            file,
            window: rows,
            ack_timeout,
        } => with_config(file.config, Reports::Output, |c: Config| {
            let rows = window(rows);
            let republish = walbox::cmd::republish::republish(&c, &rows, ack_timeout);
            finish_once(block_on(republish).map(|_| ()))
        }),
        Command::Audit {
            file,
            window: rows,
            wait,
            output,
        } => with_config(file.config, Reports::Output, |c: Config| {
            let rows = window(rows);
            let audit = walbox::cmd::audit::audit(&c, &rows, wait, output.json);
            finish_once(block_on(audit).map(|_| ()))
        }),
        Command::FromDebezium {
            config,
            allow_partial,
        } => finish_once(walbox::debezium::from_debezium(&config, allow_partial)),
        Command::Inbox { config } => with_config(config, Reports::Log, |c: InboxConfig| {
            finish(
                "walbox inbox",
                block_on(async move { walbox::inbox::run(c, shutdown_signal()).await }),
            )
        }),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "walbox", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        #[cfg(feature = "sandbox")]
        Command::Demo {
            aggregates,
            events,
            broker,
        } => {
            init_logging(LogFormat::Text, "warn");
            let demo = walbox::cmd::demo::run(aggregates, events, broker.kind());
            match runtime(2).map(|rt| rt.block_on(demo)) {
                Ok(Ok(())) => ExitCode::SUCCESS,
                Ok(Err(e)) => fail(FatalError::new(Failure::Internal, format!("{e:#}"))),
                Err(e) => fail(runtime_failed(e)),
            }
        }
    }
}
