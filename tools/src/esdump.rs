//! `esdump`: see every engine's live state.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use engine_state_reader::{
    open, open_replicas, Freshness, ReaderOptions, Reading, ReplicaReading, StateUri,
};
use engine_state_settings::cli::{StaleAfterArg, UriArg};

use crate::{cache_dump, replicas_dump, table};

/// Print the live state of every engine that publishes engine-state.
///
/// Reads the shared-memory directory (or Redis) named by --uri or
/// AGENTIC_ENGINE_STATE_URI. Engines whose files cannot be read are listed
/// with the reason (on stderr with --json); the others are still shown.
/// Names that are not valid engine ids, and control characters in error
/// messages, are shown escaped (\u{1b}, \n), never sent to the terminal raw.
///
/// The table fits 120 columns for realistic values (hundreds of engines,
/// hundreds of requests each): ENGINE, STATUS, RUN, WAIT, KV_USED,
/// PEND_PREFILL, DECODE_TOK, FLAGS, CACHE (the entries of the engine's cache
/// digest) and both ages (HB_MS, CAP_MS); an engine id longer than
/// 24 characters is shown as its first and last characters around `…`
/// (whole when another id would be shown the same).
/// --wide shows every snapshot field (STEP, the blocks, PREFILLING,
/// MAX_PREFILL, PREEMPT, CACHE_VER, CAPTURED_UTC, MONO_NS) and whole ids. With two or
/// more engines shown, a last row TOTAL (<engines>) sums RUN, WAIT,
/// PEND_PREFILL, DECODE_TOK, PREFILLING, PREEMPT and the blocks over the
/// engines shown (stale and dead ones included), and KV_USED is that of the
/// summed blocks. --wide, --sort and --filter shape the table (with --watch
/// too) and cannot be combined with --json, whose output they never change.
///
/// --cache ENGINE prints that engine's cache digest (the 512-token prefix
/// blocks it holds, docs/FORMAT.md, "Cache residency") instead: a header
/// line (engine, status, digest version, count, held, capacity and
/// kv_block_size where known, "-" otherwise, captured_age_ms), then one
/// block hash per line as 16 lowercase hex digits, ascending; with --json
/// one object with those fields and "blocks". An unknown engine, one that
/// publishes no digest (cache_version 0) and a digest that cannot be used
/// (its error class: not_digest, unknown_version, wrong_size,
/// corrupt_cache, torn, refused_entry) are errors (exit status 1); a digest
/// of an engine that is not fresh is shown, with a warning on stderr.
///
/// --replicas prints the router replicas' shared reservations instead
/// (docs/ROUTING.md, "Shared reservations"): one row per replica and engine
/// (REPLICA, STATUS, ENGINE, REQ, ONGOING_TOK, PEND_PREFILL, DECODE_TOK,
/// PREFILLING, MAX_PREFILL, HB_MS), then the replicas whose records cannot
/// be read; with --json one array of replicas.
#[derive(Debug, Parser)]
#[command(name = "esdump", version)]
pub struct Args {
    #[command(flatten)]
    pub uri: UriArg,
    /// Print one JSON array (one object per engine) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Show every column (the raw stamps, the step, the blocks, ...) and
    /// whole engine ids; the table is then wider than 120 columns.
    #[arg(long, conflicts_with = "json")]
    pub wide: bool,
    /// Sort the rows by this column (its label, case-insensitive, any column
    /// of --wide): numbers descending (busiest first), ENGINE, STATUS and
    /// FLAGS ascending; ties stay in engine id order.
    #[arg(long, value_name = "COLUMN", conflicts_with = "json")]
    pub sort: Option<String>,
    /// Show only the engines whose id starts with PREFIX (case-sensitive, as
    /// engine ids are; read errors are still all listed).
    #[arg(long, value_name = "PREFIX", conflicts_with = "json")]
    pub filter: Option<String>,
    /// Refresh in place like `top` until interrupted (Ctrl-C). A source that
    /// cannot be read for a while (its directory removed) is said so on the
    /// screen; the watch goes on.
    #[arg(long)]
    pub watch: bool,
    /// Refresh interval of --watch, in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..))]
    pub interval: u64,
    #[command(flatten)]
    pub stale_after: StaleAfterArg,
    /// Print the cache digest of this engine (its id): a header line, then
    /// one block hash per line (16 hex digits); with --json, one object.
    #[arg(long, value_name = "ENGINE", conflicts_with_all = ["watch", "wide", "sort", "filter"])]
    pub cache: Option<String>,
    /// Print the router replicas' shared reservations instead of the engines.
    #[arg(long, conflicts_with_all = ["cache", "wide", "sort", "filter"])]
    pub replicas: bool,
    /// With --watch: stop after this many refreshes (default: until interrupted).
    #[arg(long, hide = true)]
    pub count: Option<u64>,
}

/// Runs esdump, writing to `out` (table or JSON) and `err` (per-engine errors with --json).
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<()> {
    let view = table::View {
        wide: args.wide,
        sort: args
            .sort
            .as_deref()
            .map(table::SortKey::parse)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--sort: {e}"))?,
        filter: args.filter.clone(),
    };
    let uri = StateUri::from_flag_or_env(args.uri.uri.as_deref())?;
    let options = ReaderOptions {
        freshness: Freshness {
            stale_after: Duration::from_millis(args.stale_after.stale_after_ms),
            ..Freshness::default()
        },
        ..ReaderOptions::default()
    };
    if args.replicas {
        return replicas(args, &uri, options, out, err);
    }
    let mut source = open(&uri, options)?;
    let mut reading = Reading::default();
    if let Some(engine) = &args.cache {
        let id = cache_dump::engine_id_arg(engine)?;
        source.read_into(&mut reading)?;
        let dump = cache_dump::read(&reading, &uri, id.as_str())?;
        if let Some(warning) = dump.warning() {
            writeln!(err, "esdump: {warning}")?;
        }
        if args.json {
            let text = serde_json::to_string_pretty(&dump).context("encoding JSON")?;
            writeln!(out, "{text}")?;
        } else {
            write!(out, "{}", dump.text())?;
        }
        out.flush()?;
        return Ok(());
    }
    let mut refreshes = 0u64;
    loop {
        if let Err(e) = source.read_into(&mut reading) {
            if !args.watch {
                return Err(e.into());
            }
            // The directory may be gone for a moment (a cleanup, a tmpfs
            // remount, a redeploy): say so and keep watching; the engines
            // show again once it is back. With --json the output is a stream
            // of JSON documents: the error goes to stderr, no screen codes.
            let text = e.to_string();
            let message = engine_state_reader::printable(&text);
            if args.json {
                writeln!(
                    err,
                    "esdump: cannot read it now (still watching): {message}"
                )?;
            } else {
                write!(
                    out,
                    "\x1b[H\x1b[2J{}  every {} ms  (Ctrl-C to quit)\n\nesdump: cannot read it now \
                 (still watching): {}\n",
                    source.uri(),
                    args.interval,
                    message
                )?;
            }
        } else if args.json {
            let text = serde_json::to_string_pretty(&reading.engines).context("encoding JSON")?;
            writeln!(out, "{text}")?;
            for error in &reading.errors {
                // The message quotes the file name or registry member.
                writeln!(
                    err,
                    "esdump: {}",
                    engine_state_reader::printable(&error.to_string())
                )?;
            }
        } else if args.watch {
            // Home + clear screen, then the table: a flicker-free refresh in place.
            write!(
                out,
                "\x1b[H\x1b[2J{}  every {} ms  (Ctrl-C to quit)\n\n{}",
                source.uri(),
                args.interval,
                table::render(&reading, &view)
            )?;
        } else {
            write!(out, "{}", table::render(&reading, &view))?;
        }
        out.flush()?;
        refreshes += 1;
        if !args.watch || args.count.is_some_and(|n| refreshes >= n) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(args.interval));
    }
}

/// `esdump --replicas` (with --watch and --json as for engines).
fn replicas(
    args: &Args,
    uri: &StateUri,
    options: ReaderOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut source = open_replicas(uri, None, options)?;
    let mut reading = ReplicaReading::default();
    let mut refreshes = 0u64;
    loop {
        source.read_into(&mut reading)?;
        if args.json {
            let text = serde_json::to_string_pretty(&reading.replicas).context("encoding JSON")?;
            writeln!(out, "{text}")?;
            for error in &reading.errors {
                writeln!(
                    err,
                    "esdump: {}",
                    engine_state_reader::printable(&error.to_string())
                )?;
            }
        } else if args.watch {
            write!(
                out,
                "\x1b[H\x1b[2J{}  every {} ms  (Ctrl-C to quit)\n\n{}",
                source.uri(),
                args.interval,
                replicas_dump::render(&reading)
            )?;
        } else {
            write!(out, "{}", replicas_dump::render(&reading))?;
        }
        out.flush()?;
        refreshes += 1;
        if !args.watch || args.count.is_some_and(|n| refreshes >= n) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(args.interval));
    }
}
