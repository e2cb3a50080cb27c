//! The command-line flags esdump, espublish and esagent share, one spelling
//! and one default each: flatten them into a binary's `clap::Parser`
//! (`#[command(flatten)]`). A binary may reword a flag's help for its own
//! use with `#[command(mut_arg("uri", |a| a.help(...)))]`.

use crate::{DEFAULT_STALE_AFTER_MS, URI_ENV};

/// `--uri` (or `AGENTIC_ENGINE_STATE_URI`).
#[derive(Debug, Clone, clap::Args)]
pub struct UriArg {
    /// Where engine state lives: file:///dir or redis://host:port/db.
    /// [default: file:///dev/shm/agentic_engine_state]
    #[arg(long, env = URI_ENV, hide_env_values = true)]
    pub uri: Option<String>,
}

/// `--stale-after-ms` (`--stale-after`, its former esdump spelling, still
/// works, hidden).
#[derive(Debug, Clone, clap::Args)]
pub struct StaleAfterArg {
    /// A heartbeat older than this (ms) makes an engine stale.
    #[arg(
        long = "stale-after-ms",
        alias = "stale-after",
        default_value_t = DEFAULT_STALE_AFTER_MS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub stale_after_ms: u64,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Both {
        #[command(flatten)]
        uri: UriArg,
        #[command(flatten)]
        stale_after: StaleAfterArg,
    }

    #[test]
    fn one_spelling_and_the_old_one_still_parses() {
        let both = Both::try_parse_from(["x", "--stale-after-ms", "500"]).unwrap();
        assert_eq!(both.stale_after.stale_after_ms, 500);
        let old = Both::try_parse_from(["x", "--stale-after", "700"]).unwrap();
        assert_eq!(old.stale_after.stale_after_ms, 700);
        let default = Both::try_parse_from(["x", "--uri", "file:///tmp/x"]).unwrap();
        assert_eq!(default.stale_after.stale_after_ms, DEFAULT_STALE_AFTER_MS);
        assert_eq!(default.uri.uri.as_deref(), Some("file:///tmp/x"));
        assert!(Both::try_parse_from(["x", "--stale-after-ms", "0"]).is_err());
        let help = <Both as clap::CommandFactory>::command()
            .render_help()
            .to_string();
        assert!(
            help.contains("--stale-after-ms") && !help.contains("--stale-after "),
            "{help}"
        );
    }
}
