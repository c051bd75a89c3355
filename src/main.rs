//! The `queuegate` binary: parses the command line, sets up logging, loads the
//! config and hands over to the library.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;
use queuegate::admission::KeyRing;
use queuegate::cli::{Cli, Command, LogFormat, EXIT_BAD_CONFIG};
use queuegate::config::{self, Config};
use queuegate::lane_grant::{InviteInputError, InviteSpec};

/// Every request allocates header maps, buffers and futures; mimalloc's
/// per-thread free lists make those cheaper than glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = cli.log_format;
    init_logging(log_format);
    match cli.command {
        Command::Keygen => {
            println!("{}", queuegate::admission::keygen());
            ExitCode::SUCCESS
        }
        Command::Check { config } => match queuegate::check(&config) {
            Ok(warnings) => {
                for w in warnings {
                    eprintln!("warning: {w}");
                }
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{}: invalid configuration", config.display());
                eprintln!("{errors}");
                ExitCode::from(EXIT_BAD_CONFIG as u8)
            }
        },
        Command::Run { config: path } => {
            let config = match Config::load_with_warnings(&path) {
                Ok(loaded) => {
                    for warning in &loaded.warnings {
                        tracing::warn!(path = %path.display(), "config: {warning}");
                    }
                    loaded.config
                }
                Err(errors) => {
                    eprintln!("{}: invalid configuration", path.display());
                    eprintln!("{errors}");
                    return ExitCode::from(EXIT_BAD_CONFIG as u8);
                }
            };
            serve(log_format, async move {
                let listeners = queuegate::Listeners::bind(&config).await?;
                queuegate::run_file(&path, config, listeners, queuegate::shutdown::signal()).await
            })
        }
        Command::Demo { listen, capacity } => {
            serve(log_format, queuegate::demo::run(listen, capacity))
        }
        Command::Invite {
            config,
            route,
            lane,
            expires,
            uses,
        } => invite(&config, &route, &lane, &expires, uses),
    }
}

/// `queuegate invite`: checks the input against the config before reading
/// any key, then prints the token alone on stdout. Bad input exits 64 with
/// one line; keys that cannot be read exit 1.
fn invite(path: &Path, route: &str, lane: &str, expires: &str, uses: u64) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{}: invalid configuration", path.display());
            eprintln!("{errors}");
            return ExitCode::from(EXIT_BAD_CONFIG as u8);
        }
    };
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let spec = config::parse_duration(expires)
        .map_err(InviteInputError::BadExpiry)
        .and_then(|valid_for| InviteSpec::new(&config, route, lane, valid_for, uses, now_unix));
    let spec = match spec {
        Ok(spec) => spec,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG as u8);
        }
    };
    match KeyRing::load(&config.keys) {
        Ok(ring) => {
            println!("{}", spec.sign(&ring));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: keys: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Client connections are served on worker threads of their own
/// (`limits.workers`); this runtime runs the rest: the admin listener, the
/// admitters, reloads and signals. An error ends the process with exit
/// code 1 and one line naming what failed: an `error` event in JSON logs,
/// a plain line otherwise.
fn serve(
    log_format: LogFormat,
    fut: impl std::future::Future<Output = anyhow::Result<()>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let line = one_line(&err);
            match log_format {
                LogFormat::Json => tracing::error!("{line}"),
                LogFormat::Text => eprintln!("error: {line}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `error: cause: cause`, leaving out a cause
/// whose text the message before it already ends with (queuegate's errors
/// show their cause and keep it as their source too).
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("QUEUEGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
