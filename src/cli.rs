//! The command line: `run`, `check`, `demo`, `keygen`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// A virtual waiting room that runs as a reverse-proxy sidecar.
#[derive(Debug, Parser)]
#[command(name = "queuegate", version, about)]
pub struct Cli {
    /// Log output format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run with a config file.
    Run {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate a config file; exits 64 naming every problem.
    Check {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Run a demo: an embedded origin behind queuegate, memory store, a tiny
    /// capacity on /tickets so a few private windows show the line.
    Demo {
        /// Where the demo listens.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Concurrent visitors admitted to /tickets.
        #[arg(long, default_value_t = 2)]
        capacity: u64,
    },
    /// Print a fresh random key for the key ring.
    Keygen,
}

/// Exit code for a config that does not validate (EX_USAGE).
pub const EXIT_BAD_CONFIG: i32 = 64;
