//! `esdump --cache ENGINE`: one engine's cache digest (docs/FORMAT.md,
//! "Cache residency"), as a header line and one block hash per line, or as
//! one JSON object.
//!
//! The engine's state comes from the reader (its status, generation and
//! the `cache_version` its snapshot names); the digest is read whole, with
//! its header and control words (`held`, the file's capacity, the KV block
//! size), from the file `<dir>.cache/<id>` or the Redis key
//! `<prefix>cache:<id>` (fetched like the reader does, size-bounded), and
//! validated by shm-format. The reader's digest ([`engine_state_reader::EngineState::cache`])
//! carries only the blocks, so it is not used here.

use std::fmt::Write as _;
use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail};
use engine_state_reader::{millis, printable, EngineState, Reading, StateUri, Status};
use engine_state_shm_format::{
    cache_dir, monotonic_ns, DigestError, DigestFile, DigestRecord, EngineId, Error as FormatError,
};
use serde::Serialize;

/// At most this many engine ids are named when `--cache` names none of them.
const NAMED_ENGINES: usize = 10;

/// One engine's digest as `esdump --cache` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CacheDump {
    /// The engine id.
    pub engine_id: String,
    /// The engine's status (`fresh`, `stale`, `dead`, `torn`): routers use
    /// the digest only while it is `fresh`.
    pub status: String,
    /// The generation of the engine's file (Redis record), which the
    /// digest's equals.
    pub generation: u64,
    /// The digest's version (≥ 1; the snapshot's `cache_version` names it,
    /// or an older one for a moment: the digest is written first).
    pub version: u64,
    /// Valid entries (the snapshot's `cache_blocks`).
    pub count: usize,
    /// Router blocks the engine held at the capture (more than `count`: the
    /// digest was cut to its capacity).
    pub held: u64,
    /// Entries the digest file holds; `None` on Redis (a value holds
    /// exactly its entries, so the writer's capacity is not known).
    pub capacity: Option<usize>,
    /// The engine's KV block size in tokens; `None` when the writer did not
    /// say (0).
    pub kv_block_size: Option<u32>,
    /// `CLOCK_REALTIME` at the digest's capture, ns since the epoch (display).
    pub captured_unix_ns: u64,
    /// Time since the digest's capture (since it last changed), in ms as
    /// `esdump --json`'s ages (microsecond resolution).
    pub captured_age_ms: f64,
    /// The entries, ascending, each as 16 lowercase hex digits.
    pub blocks: Vec<String>,
}

/// A router block hash as `esdump --cache` prints it: 16 lowercase hex digits.
pub fn block_hex(hash: u64) -> String {
    format!("{hash:016x}")
}

/// The `--cache` argument as an engine id, or an error that says what one is.
pub fn engine_id_arg(arg: &str) -> anyhow::Result<EngineId> {
    EngineId::new(arg).map_err(|e| anyhow!("--cache: {e}"))
}

/// The engine `id` of `reading`, or an error: the reason its file or key
/// could not be read, or that no such engine publishes there (naming some
/// that do).
pub fn engine_of<'r>(reading: &'r Reading, id: &str, uri: &str) -> anyhow::Result<&'r EngineState> {
    if let Some(engine) = reading.get(id) {
        return Ok(engine);
    }
    if let Some(error) = reading.errors.iter().find(|e| e.name == id) {
        bail!(
            "engine {id:?} cannot be read, so neither can its cache digest: {}",
            printable(&error.error.to_string())
        );
    }
    let mut there = String::new();
    for (i, engine) in reading.engines.iter().take(NAMED_ENGINES).enumerate() {
        let _ = write!(
            there,
            "{}{}",
            if i == 0 { "" } else { ", " },
            engine.engine_id
        );
    }
    if reading.engines.len() > NAMED_ENGINES {
        let _ = write!(there, ", … ({} in all)", reading.engines.len());
    }
    if there.is_empty() {
        there.push_str("none");
    }
    bail!(
        "no engine {id:?} at {uri} (engines there: {there}); check the id and --uri (esdump \
         without --cache lists the engines)"
    )
}

/// What a digest fetch found, before it is checked against the engine.
#[derive(Debug)]
pub enum Fetched {
    /// The digest, with the capacity of its file (`None`: a Redis value).
    Digest(DigestRecord, Option<usize>),
    /// Nothing at the location (no file, an empty or expired key).
    Missing,
    /// The file's writer retired it (closed, or replaced it just now).
    Retired,
    /// The digest is unusable: its error class and message.
    Refused(&'static str, String),
}

/// Reads the digest file `<dir>.cache/<id>`: its location and what it holds.
pub fn fetch_shm(dir: &Path, id: &str) -> (String, Fetched) {
    let path = cache_dir(dir).join(id);
    let location = path.display().to_string();
    let file = match DigestFile::open(&path) {
        Ok(file) => file,
        Err(FormatError::Io { io, .. }) if io.kind() == ErrorKind::NotFound => {
            return (location, Fetched::Missing)
        }
        Err(FormatError::Digest { error, .. }) => {
            return (location, Fetched::Refused(error.kind(), error.to_string()))
        }
        Err(error @ FormatError::RefusedEntry { .. }) => {
            return (
                location,
                Fetched::Refused("refused_entry", error.to_string()),
            )
        }
        Err(error) => return (location, Fetched::Refused("io", error.to_string())),
    };
    if file.is_retired() {
        return (location, Fetched::Retired);
    }
    let fetched = match file.read_record() {
        Ok(record) => Fetched::Digest(record, Some(file.capacity())),
        Err(error @ DigestError::Torn(_)) => Fetched::Refused(
            "torn",
            format!(
                "{error} (its writer may have died mid-write, or the file was truncated); if it \
                 stays torn, restart the engine's publisher (it rewrites the digest)"
            ),
        ),
        Err(error) => Fetched::Refused(error.kind(), error.to_string()),
    };
    (location, fetched)
}

/// Fetches the digest value `<prefix>cache:<id>` as readers do
/// (`GETRANGE key 0 CACHE_FETCH_END`: a value larger than any digest is
/// refused without transferring it): its key and what it holds. An error
/// is the server's (unreachable, refused), password hidden.
pub fn fetch_redis(
    target: &engine_state_reader::redis::RedisTarget,
    id: &str,
) -> anyhow::Result<(String, Fetched)> {
    use engine_state_reader::redis::{cache_key, CACHE_FETCH_END};
    use engine_state_shm_format::{decode_digest_value, MAX_DIGEST_SIZE};
    let target = target.clone().for_reading();
    let key = cache_key(target.prefix(), id);
    let mut con = target.connect()?;
    let bytes: Vec<u8> = redis::cmd("GETRANGE")
        .arg(&key)
        .arg(0)
        .arg(CACHE_FETCH_END)
        .query(&mut con)
        .map_err(|e| target.error(&format!("GETRANGE {key}"), &e))?;
    let fetched = if bytes.is_empty() {
        Fetched::Missing
    } else if bytes.len() > MAX_DIGEST_SIZE {
        Fetched::Refused(
            "corrupt_cache",
            format!(
                "a value larger than the largest digest ({MAX_DIGEST_SIZE} bytes); delete the \
                 key (the engine's publisher writes its digest again when it changes)"
            ),
        )
    } else {
        match decode_digest_value(&bytes) {
            Ok(record) => Fetched::Digest(record, None),
            Err(error) => Fetched::Refused(error.kind(), error.to_string()),
        }
    };
    Ok((key, fetched))
}

/// Fetches engine `engine`'s digest from the source `uri` names.
pub fn fetch(uri: &StateUri, id: &str) -> anyhow::Result<(String, Fetched)> {
    match uri {
        StateUri::Shm { dir } => Ok(fetch_shm(dir, id)),
        StateUri::Redis { target } => fetch_redis(target, id),
    }
}

/// The dump of `engine`'s digest as fetched from `location`, or an error
/// that says what is wrong (the error class for a damaged digest) and what
/// to do. `now_mono_ns`: this host's `CLOCK_MONOTONIC` just after the fetch,
/// for a digest read from shared memory (same host); a Redis digest's age
/// is told from the engine's capture age on the writer's clock.
pub fn dump(
    engine: &EngineState,
    location: &str,
    fetched: Fetched,
    now_mono_ns: Option<u64>,
) -> anyhow::Result<CacheDump> {
    let id = &*engine.engine_id;
    let version = engine.snapshot.cache_version;
    if version == 0 && engine.status != Status::Torn {
        bail!(
            "engine {id:?} publishes no cache digest (its snapshot's cache_version is 0); a \
             publisher writes one with publish_cache (the vLLM hook does unless \
             AGENTIC_ENGINE_STATE_RESIDENCY=off; espublish with --cache-blocks N)"
        );
    }
    let record = match fetched {
        Fetched::Digest(record, capacity) => (record, capacity),
        Fetched::Missing => bail!(
            "engine {id:?} names cache digest version {version}, but {location} does not exist \
             (not written yet, expired, or removed); run esdump --cache again in a moment, and \
             if it stays missing restart the engine's publisher"
        ),
        Fetched::Retired => bail!(
            "the cache digest of engine {id:?} at {location} was retired by its writer (the \
             engine closed, or is replacing the file); run esdump --cache again"
        ),
        Fetched::Refused(class, message) => bail!(
            "the cache digest of engine {id:?} at {location} cannot be used ({class}): {}",
            printable(&message)
        ),
    };
    let (record, capacity) = record;
    if record.generation != engine.generation {
        bail!(
            "the cache digest at {location} belongs to generation {} of engine {id:?}, not to \
             its current generation {} (an earlier run left it; the current one has not written \
             its digest yet); run esdump --cache again in a moment",
            record.generation,
            engine.generation
        );
    }
    let digest = &record.digest;
    let captured_age = match now_mono_ns {
        Some(now) => Duration::from_nanos(now.saturating_sub(digest.captured_mono_ns())),
        // Both capture stamps are on the writer's clock: the digest's age is
        // the snapshot's plus the time between the two captures.
        None => {
            let between = engine
                .snapshot
                .captured_mono_ns
                .saturating_sub(digest.captured_mono_ns());
            engine.capture_age + Duration::from_nanos(between)
        }
    };
    Ok(CacheDump {
        engine_id: id.to_owned(),
        status: engine.status.to_string(),
        generation: engine.generation,
        version: digest.version(),
        count: digest.len(),
        held: record.held,
        capacity,
        kv_block_size: (record.kv_block_size != 0).then_some(record.kv_block_size),
        captured_unix_ns: record.captured_unix_ns,
        captured_age_ms: millis(captured_age),
        blocks: digest.blocks().iter().copied().map(block_hex).collect(),
    })
}

/// Reads engine `id`'s digest: the engine from `reading` (read from `uri`),
/// then its digest.
pub fn read(reading: &Reading, uri: &StateUri, id: &str) -> anyhow::Result<CacheDump> {
    let engine = engine_of(reading, id, &uri.to_string())?;
    let (location, fetched) = fetch(uri, id)?;
    let now = matches!(uri, StateUri::Shm { .. }).then(monotonic_ns);
    dump(engine, &printable(&location), fetched, now)
}

impl CacheDump {
    /// The header line: every field but the blocks, as `name value` pairs
    /// (`-` for what is not known).
    pub fn header(&self) -> String {
        let known = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
        format!(
            "engine {}  status {}  version {}  count {}  held {}  capacity {}  kv_block_size {}  \
             captured_age_ms {:.1}",
            self.engine_id,
            self.status,
            self.version,
            self.count,
            self.held,
            known(self.capacity.map(|c| c.to_string())),
            known(self.kv_block_size.map(|k| k.to_string())),
            self.captured_age_ms
        )
    }

    /// The text output: the header line, then one block per line.
    pub fn text(&self) -> String {
        let mut out = String::with_capacity(64 + 17 * self.blocks.len());
        out.push_str(&self.header());
        out.push('\n');
        for block in &self.blocks {
            out.push_str(block);
            out.push('\n');
        }
        out
    }

    /// What to say on stderr when the digest must not be used (the engine
    /// is not fresh), else `None`.
    pub fn warning(&self) -> Option<String> {
        (self.status != Status::Fresh.as_str()).then(|| {
            format!(
                "engine {:?} is {}: its cache digest is shown as last published, but routers do \
                 not use it until the engine reads fresh again",
                self.engine_id, self.status
            )
        })
    }
}

#[cfg(test)]
#[path = "cache_dump_tests.rs"]
mod tests;
