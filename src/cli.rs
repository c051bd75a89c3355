//! The command line: `run`, `check`, `demo`, `keygen`, `invite`.

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
    /// Print an invite token: a link with `?qg_invite=TOKEN` puts whoever
    /// follows it in a lane of a route (DESIGN §8.5). Signed with the key
    /// ring the config names; exits 64 on bad input.
    Invite {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
        /// The route the invite is for.
        #[arg(long)]
        route: String,
        /// The lane it puts its holder in: one of the route's `lanes`
        /// (`main` for a route that names none).
        #[arg(long)]
        lane: String,
        /// How long the token is valid from now, as the config writes
        /// durations (30m, 24h); at least 1s.
        #[arg(long, default_value = "24h")]
        expires: String,
        /// How many visitors may use it; 0 for unlimited.
        #[arg(long, default_value_t = 0)]
        uses: u64,
    },
}

/// Exit code for a config that does not validate or other bad input on the
/// command line (EX_USAGE).
pub const EXIT_BAD_CONFIG: i32 = 64;
