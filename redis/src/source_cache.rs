//! The Redis source's cache digests (docs/REDIS.md, "Key schema"; the
//! value: docs/FORMAT.md, "Cache residency"), read only when asked
//! ([`RedisSource::read_cache_digests`]).
//!
//! A digest is fetched only for an engine whose record names a
//! `cache_version` past the digest held (or of another generation), in one
//! more round trip after the records' (the version is only known once the
//! record is read), and only when some engine needs it: a fleet whose
//! digests did not move reads no digest bytes.
//!
//! A digest that cannot be had is that engine's fault only: the records this
//! refresh read stay read. A refused `GETRANGE` (`NOPERM`, ...) is reported
//! like a damaged value; a connection that fails during the digests' round
//! trip is dropped (a reply may be half read), and those engines' digests
//! are fetched again with the next refresh, which reconnects.

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::CacheDigest;
use redis::Value;

use super::{Class, RedisSource};
use crate::error::Error;
use crate::fetch::{decode_fetched_cache, CacheRefused, CACHE_FETCH_END};
use crate::schema::cache_key;
use crate::target::query_by;

/// What a source holds of one engine's digest.
#[derive(Debug, Default)]
pub(super) struct CacheSlot {
    /// The last digest read, and the record generation it belongs to.
    held: Option<(u64, Arc<CacheDigest>)>,
    /// A version whose digest could not be had: not fetched again until the
    /// record names another one.
    failed: Option<Failed>,
}

#[derive(Debug)]
struct Failed {
    version: u64,
    key: String,
    what: String,
    /// A value that is not a digest is reported at every read; a missing or
    /// mismatched one only with the refresh that found it.
    every_read: bool,
    /// The refresh that found it.
    found_at: u64,
    /// The fetch itself failed (the connection, not the value): fetched
    /// again with the next refresh.
    retry: bool,
    /// A missing digest (not a damaged one) is fetched again from then on:
    /// its writer may put it in place without naming a new version (one
    /// that regains its engine id after another run held it writes its
    /// digest after its first record).
    again_at: Option<Instant>,
}

/// How long a missing digest of one version is not fetched again.
pub(crate) const MISSING_DIGEST_RETRY: Duration = Duration::from_secs(1);

/// Why an engine's digest is not used, as [`crate::EngineView::cache_fault`]
/// reports it.
#[derive(Clone, Copy, Debug)]
pub struct CacheFault<'a> {
    /// The digest key.
    pub key: &'a str,
    /// What is wrong.
    pub what: &'a str,
    /// The value is not a digest (reported at every read); false: no
    /// digest there for the record (missing, of another run, older, or the
    /// fetch failed), said with the refresh that found it.
    pub damaged: bool,
}

impl CacheSlot {
    /// The digest held for a record of `generation` naming `version` (None
    /// when it names none, or the held one is older or of another run).
    pub(super) fn digest(&self, generation: u64, version: u64) -> Option<&Arc<CacheDigest>> {
        match &self.held {
            Some((held, digest))
                if version != 0 && *held == generation && digest.version() >= version =>
            {
                Some(digest)
            }
            _ => None,
        }
    }

    /// Whether the record (`generation`, `version`) needs a fetch at `now`.
    fn wants(&self, generation: u64, version: u64, now: Instant) -> bool {
        version != 0
            && self.digest(generation, version).is_none()
            && self.failed.as_ref().is_none_or(|f| {
                f.retry || f.version != version || f.again_at.is_some_and(|at| now >= at)
            })
    }

    /// What to report with the read after refresh number `refresh`, for a
    /// record naming `version`.
    pub(super) fn fault(&self, version: u64, refresh: u64) -> Option<CacheFault<'_>> {
        let failed = self.failed.as_ref()?;
        (failed.every_read || failed.found_at == refresh)
            .then(|| self.remembered(version))
            .flatten()
    }

    /// Why the record naming `version` has no digest, whenever the refresh
    /// that found it was (see [`RedisSource::cache_fault_of`]).
    fn remembered(&self, version: u64) -> Option<CacheFault<'_>> {
        let failed = self.failed.as_ref()?;
        (version != 0 && failed.version == version).then(|| CacheFault {
            key: &failed.key,
            what: &failed.what,
            damaged: failed.every_read,
        })
    }
}

impl RedisSource {
    /// Why engine `id`'s last record, naming digest `version`, has no
    /// digest, at every call ([`crate::EngineView::cache_fault`] says a
    /// missing one only with the refresh that found it): for a caller that
    /// asks about one engine.
    pub fn cache_fault_of(&self, id: &str, version: u64) -> Option<CacheFault<'_>> {
        self.engines.get(id)?.cache.remembered(version)
    }

    /// Fetches the digests the records just read name and this source does
    /// not hold (one round trip, none when no digest moved). Never fails the
    /// refresh: what goes wrong is the engines' fault (module docs).
    pub(super) fn fetch_digests(&mut self, deadline: Instant) {
        if !self.cache_digests {
            return;
        }
        let now = Instant::now();
        let wanted: Vec<(Arc<str>, u64, u64)> = self
            .live
            .keys()
            .filter_map(|id| {
                let engine = &self.engines[id];
                let record = &engine.last_record.as_ref()?.record;
                let (generation, version) = (record.generation, record.snapshot.cache_version);
                engine
                    .cache
                    .wants(generation, version, now)
                    .then(|| (id.clone(), generation, version))
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let mut request = Vec::new();
        for (id, _, _) in &wanted {
            redis::cmd("GETRANGE")
                .arg(cache_key(self.target.prefix(), id))
                .arg(0)
                .arg(CACHE_FETCH_END)
                .write_packed_command(&mut request);
        }
        let refresh = self.refreshes;
        if Instant::now() >= deadline {
            // The records' round trip took the read's time: nothing sent,
            // the connection is good.
            return self.retry_later(
                wanted,
                "the read's time ran out before the digests' round trip",
            );
        }
        let con = self.con.as_mut().expect("connected before fetch");
        let replies = match query_by(con, &request, wanted.len(), deadline) {
            Ok(replies) => replies,
            Err(error) => {
                let error: Error = self.target.error("cannot fetch cache digests", &error);
                // A reply may be half read: the next refresh reconnects
                // (without a backoff: the records' round trip worked).
                self.con = None;
                return self.retry_later(wanted, &error.to_string());
            }
        };
        for ((id, generation, version), reply) in wanted.into_iter().zip(replies) {
            let Some(engine) = self.engines.get_mut(&id) else {
                continue;
            };
            if engine.class() != Class::Live {
                continue;
            }
            let key = cache_key(self.target.prefix(), &id);
            let damaged = |what: String| CacheRefused {
                what,
                damaged: true,
            };
            let decoded = match reply {
                Value::BulkString(bytes) => decode_fetched_cache(&bytes, generation, version),
                Value::Nil => decode_fetched_cache(&[], generation, version),
                Value::ServerError(e) if e.code() == "WRONGTYPE" => Err(damaged(
                    "the key holds a list, hash, set or other non-string type".to_owned(),
                )),
                Value::ServerError(e) => Err(damaged(format!(
                    "the server refused GETRANGE ({e}); a Redis user that reads digests needs \
                     read access to the <prefix>cache:* keys (docs/REDIS.md, \"Key schema\")"
                ))),
                other => Err(damaged(format!("unexpected reply {other:?}"))),
            };
            let slot = &mut engine.cache;
            match decoded {
                Ok(digest) => {
                    slot.held = Some((generation, Arc::new(digest)));
                    slot.failed = None;
                }
                Err(refused) => {
                    // Still missing at a retry: said once per version.
                    let found_at = match &slot.failed {
                        Some(f) if f.version == version && !f.retry && !refused.damaged => {
                            f.found_at
                        }
                        _ => refresh,
                    };
                    slot.failed = Some(Failed {
                        version,
                        key,
                        what: refused.what,
                        every_read: refused.damaged,
                        found_at,
                        retry: false,
                        again_at: (!refused.damaged).then(|| now + MISSING_DIGEST_RETRY),
                    });
                }
            }
        }
    }

    /// Marks the digests `wanted` as not had this refresh, for `why`: each
    /// engine's error with this read, fetched again with the next.
    fn retry_later(&mut self, wanted: Vec<(Arc<str>, u64, u64)>, why: &str) {
        let refresh = self.refreshes;
        for (id, _, version) in wanted {
            let key = cache_key(self.target.prefix(), &id);
            if let Some(engine) = self.engines.get_mut(&id) {
                engine.cache.failed = Some(Failed {
                    version,
                    key,
                    what: format!("{why}; fetched again with the next read"),
                    every_read: false,
                    found_at: refresh,
                    retry: true,
                    again_at: None,
                });
            }
        }
    }
}
