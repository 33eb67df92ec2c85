//! The `walbox` binary: parse the command line, load configuration, set up logging, run.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use walbox::cli::{Cli, Command};
use walbox::config::{self, LogFormat};
use walbox::failure::Failure;

fn init_logging(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_env("WALBOX_LOG")
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn fail(failure: Failure, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("walbox: error: {message}");
    ExitCode::from(failure.exit_code())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(Failure::Internal, format!("cannot start runtime: {e}")),
    };
    match cli.command {
        Command::Run { config } => {
            let config = match config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return fail(Failure::Config, e),
            };
            init_logging(config.log.format, &config.log.level);
            match runtime.block_on(walbox::app::run(config, shutdown_signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, exit_status = e.failure.exit_code(), "walbox stopped");
                    fail(e.failure, e)
                }
            }
        }
        Command::Inbox { config } => {
            let config = match walbox::inbox::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return fail(Failure::Config, e),
            };
            init_logging(config.log.format, &config.log.level);
            match runtime.block_on(walbox::inbox::run(config, shutdown_signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, exit_status = e.failure.exit_code(), "walbox inbox stopped");
                    fail(e.failure, e)
                }
            }
        }
        Command::Demo { aggregates, events } => {
            init_logging(LogFormat::Text, "warn");
            match runtime.block_on(walbox::demo::run(aggregates, events)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(Failure::Internal, format!("{e:#}")),
            }
        }
    }
}
