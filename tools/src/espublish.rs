//! `espublish`: publish synthetic engine state, for testing readers and
//! routers without vLLM.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use engine_state_publisher::{Publisher, PublisherConfig};
use engine_state_reader::StateUri;
use engine_state_settings::cli::UriArg;
use engine_state_shm_format::blocks::{next_block_hash, BLOCK_TOKENS, CHAIN_SEED};
use engine_state_shm_format::{
    monotonic_ns, EngineId, ShmWriter, Snapshot, WriterOptions, MAX_DIGEST_ENTRIES, SNAPSHOT_WORDS,
};

/// Publish synthetic engine state through the real publisher.
///
/// Publishes the given fields every period until --duration runs out (or
/// forever). --stress instead writes a self-checking payload as fast as it
/// can: every word i of snapshot v is v*(i+1), so a reader can tell a torn copy.
///
/// --cache-blocks N also publishes a cache digest (docs/FORMAT.md, "Cache
/// residency") of N blocks: the router block hashes (shm-format's
/// block_hashes) of the token ids 0, 1, ..., N*512-1, i.e. one prompt of N
/// full 512-token blocks, with held = N and a digest capacity of N. A
/// router sees every prefix of that prompt as cached on this engine.
///
/// SIGTERM and SIGINT (Ctrl-C) stop it cleanly: the file is retired and
/// removed (or the Redis key deleted), so readers see the engine leave
/// instead of a dead file.
#[derive(Debug, Parser)]
#[command(name = "espublish", version)]
#[command(mut_arg("uri", |a| a.help(
    "Where to publish: file:///dir or redis://[user:password@]host:port/db. \
     [default: file:///dev/shm/agentic_engine_state]"
)))]
pub struct Args {
    #[command(flatten)]
    pub uri: UriArg,
    /// The engine id. [default: AGENTIC_WORKER_ID, else <hostname>-<pid>]
    #[arg(long)]
    pub engine_id: Option<String>,
    /// Publish (and heartbeat) period in milliseconds. [default: 50]
    #[arg(long)]
    pub period_ms: Option<u64>,
    /// A snapshot field to publish, as name=value (repeatable), e.g. num_running=4.
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub fields: Vec<String>,
    /// Stop after this many seconds (fractions allowed). [default: run until killed]
    #[arg(long)]
    pub duration: Option<f64>,
    /// Write the self-checking stress payload as fast as possible.
    #[arg(long)]
    pub stress: bool,
    /// Also publish a cache digest of N synthetic blocks: the router block
    /// hashes of token ids 0..N*512 (token i is i), held N; N at most
    /// 131072 (MAX_DIGEST_ENTRIES).
    #[arg(long, value_name = "N", conflicts_with = "stress")]
    pub cache_blocks: Option<usize>,
}

/// Longest `--duration`: about 31 years (longer is "until killed").
const MAX_DURATION_S: f64 = 1e9;

/// Runs espublish.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let snapshot = parse_fields(&args.fields)?;
    let cache = args.cache_blocks.map(synthetic_cache_blocks).transpose()?;
    let deadline = match args.duration {
        // Bounded so the conversion and the addition cannot panic (1e20 did).
        Some(s) if (0.0..=MAX_DURATION_S).contains(&s) => {
            Some(Instant::now() + Duration::from_secs_f64(s))
        }
        Some(s) => bail!(
            "--duration {s} must be a number of seconds in 0..={MAX_DURATION_S} \
             (leave it out to run until killed)"
        ),
        None => None,
    };
    let config = PublisherConfig::resolve(
        args.uri.uri.as_deref(),
        args.engine_id.as_deref(),
        args.period_ms,
        None,
    )?;
    let stop = stop_on_signals()?;
    if args.stress {
        return stress(&config, deadline, &stop);
    }
    let mut publisher = Publisher::start(config)?;
    let period = publisher.config().period;
    let mut digest_note = String::new();
    if let Some(blocks) = &cache {
        // Before the first snapshot, so that every snapshot names it.
        publisher.publish_cache(blocks, blocks.len() as u64, blocks.len())?;
        digest_note = format!(" with a cache digest of {} blocks", blocks.len());
    }
    publisher.publish(snapshot)?;
    // Printed after the first publish: a reader that saw this line sees the
    // fields (on shared memory; Redis writes are the sink thread's).
    println!(
        "espublish: publishing {}{digest_note} to {}",
        publisher.engine_id(),
        publisher.config().uri
    );
    let mut step = snapshot.step;
    while deadline.is_none_or(|d| Instant::now() < d) {
        if let Ok(signal) = stop.recv_timeout(period) {
            eprintln!("espublish: {signal}: retiring {}", publisher.engine_id());
            break;
        }
        step += 1;
        publisher.publish(Snapshot { step, ..snapshot })?;
    }
    publisher.close();
    Ok(())
}

/// Blocks SIGTERM and SIGINT in this thread (and so in every thread started
/// after it, such as the heartbeat's) and returns a channel that receives
/// the signal's name when one arrives: the loops stop and the file is retired
/// and removed, as at the end of `--duration`. (Without this, either signal
/// would kill the process and leave a dead writer's file behind.)
fn stop_on_signals() -> anyhow::Result<mpsc::Receiver<&'static str>> {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .context("blocking SIGTERM and SIGINT")?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("es-signals".to_owned())
        .spawn(move || {
            while let Ok(signal) = signals.wait() {
                if tx.send(signal.as_str()).is_err() {
                    return;
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(rx)
}

fn stress(
    config: &PublisherConfig,
    deadline: Option<Instant>,
    stop: &mpsc::Receiver<&'static str>,
) -> anyhow::Result<()> {
    let StateUri::Shm { dir } = &config.uri else {
        bail!("--stress needs a file:// URI")
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let id = EngineId::new(config.engine_id.as_str())?;
    let mut writer = ShmWriter::create(dir, &id, &WriterOptions::default(), &stress_payload(1))?;
    println!("espublish: stress-writing {id} to {}", config.uri);
    let mut v = 1u64;
    loop {
        for _ in 0..1024 {
            v += 1;
            writer.publish(&stress_payload(v))?;
        }
        writer.stamp_heartbeat(monotonic_ns());
        if deadline.is_some_and(|d| Instant::now() >= d) || stop.try_recv().is_ok() {
            return Ok(()); // dropping the writer retires and removes the file
        }
    }
}

/// Snapshot `v` of the stress payload: word i is `v * (i + 1)`.
pub fn stress_payload(v: u64) -> Snapshot {
    Snapshot::from_words(core::array::from_fn(|i| v.wrapping_mul(i as u64 + 1)))
}

/// True when `snapshot` is a whole stress payload.
pub fn is_whole_stress_payload(snapshot: &Snapshot) -> bool {
    let words: [u64; SNAPSHOT_WORDS] = snapshot.to_words();
    words
        .iter()
        .enumerate()
        .all(|(i, w)| *w == words[0].wrapping_mul(i as u64 + 1))
}

/// The blocks of `--cache-blocks n`: the router block hashes of the token
/// ids `0..n * BLOCK_TOKENS` (token `i` is `i as u32`), computed one block
/// at a time (`next_block_hash`, which is `block_hashes` block by block),
/// so the largest digest needs no 256 MiB token list. More than
/// [`MAX_DIGEST_ENTRIES`] is refused.
pub fn synthetic_cache_blocks(n: usize) -> anyhow::Result<Vec<u64>> {
    if n > MAX_DIGEST_ENTRIES {
        bail!(
            "--cache-blocks {n}: a cache digest holds at most {MAX_DIGEST_ENTRIES} entries \
             (MAX_DIGEST_ENTRIES); pass at most that"
        );
    }
    let mut block = vec![0u32; BLOCK_TOKENS];
    let mut parent = CHAIN_SEED;
    let mut hashes = Vec::with_capacity(n);
    for b in 0..n {
        for (offset, token) in block.iter_mut().enumerate() {
            // At most 131072 x 512 = 2^26 tokens: every id fits a u32.
            *token = (b * BLOCK_TOKENS + offset) as u32;
        }
        parent = next_block_hash(parent, &block);
        hashes.push(parent);
    }
    Ok(hashes)
}

fn parse_fields(fields: &[String]) -> anyhow::Result<Snapshot> {
    let mut words = Snapshot::default().to_words();
    for field in fields {
        let Some((name, value)) = field.split_once('=') else {
            bail!("--set {field:?}: expected FIELD=VALUE, e.g. --set num_running=4");
        };
        let Some(index) = Snapshot::FIELD_NAMES.iter().position(|n| *n == name.trim()) else {
            bail!(
                "--set {field:?}: unknown field; fields are {}",
                Snapshot::FIELD_NAMES.join(", ")
            );
        };
        if index < 2 {
            bail!("--set {field:?}: captured_* are stamped by the publisher");
        }
        words[index] = value.trim().parse().with_context(|| {
            format!("--set {field:?}: the value must be a non-negative integer")
        })?;
    }
    Ok(Snapshot::from_words(words))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_by_contract_name() {
        let s = parse_fields(&["num_running=4".into(), " step = 9".into()]).unwrap();
        assert_eq!((s.num_running, s.step), (4, 9));
        for (bad, hint) in [
            ("num_running", "FIELD=VALUE"),
            ("bogus=1", "unknown field"),
            ("num_running=-1", "non-negative"),
            ("captured_mono_ns=5", "stamped"),
        ] {
            let err = parse_fields(&[bad.into()]).unwrap_err().to_string();
            assert!(err.contains(hint), "{bad}: {err}");
        }
    }

    #[test]
    fn cache_blocks_are_the_block_hashes_of_tokens_0_to_n_blocks() {
        use engine_state_shm_format::blocks::block_hashes;
        for n in [0usize, 1, 3] {
            let tokens: Vec<u32> = (0..(n * BLOCK_TOKENS) as u32).collect();
            assert_eq!(
                synthetic_cache_blocks(n).unwrap(),
                block_hashes(&tokens),
                "n = {n}"
            );
        }
        assert_eq!(
            synthetic_cache_blocks(MAX_DIGEST_ENTRIES).unwrap().len(),
            MAX_DIGEST_ENTRIES
        );
        let err = synthetic_cache_blocks(MAX_DIGEST_ENTRIES + 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--cache-blocks 131073") && err.contains("at most 131072"),
            "{err}"
        );
    }

    #[test]
    fn stress_payload_is_self_checking() {
        assert!(is_whole_stress_payload(&stress_payload(12345)));
        let mut torn = stress_payload(7).to_words();
        torn[9] = stress_payload(8).to_words()[9];
        assert!(!is_whole_stress_payload(&Snapshot::from_words(torn)));
    }
}
