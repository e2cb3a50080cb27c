//! The engine-state embedded router: shadow accounting, the
//! `max(shadow, real)` merge with fresh engine snapshots, and the routing
//! policies (docs/ROUTING.md, "The router"), for routers written in Rust
//! (and, through a thin binding, Python).
//!
//! - [`Router`]: the instances, their shadow counters and prefix caches, the
//!   latest [`RealState`] of each; [`Router::pick`] chooses an instance and
//!   reserves the request on it as one atomic step.
//! - [`Reservation`]: the handle a pick returns; `prefill_done`, `complete`,
//!   `fail`, or dropping it, move and release the counters.
//! - [`RouterSettings`]: the [`Policy`] (`load_only`, `lmetric`, `sticky`,
//!   `unified`), where real state is consulted ([`RealStateUse`]), where
//!   cache hits come from ([`CacheKnowledge`]: the engines' cache digests or
//!   the router's estimate), and every threshold, with the documented
//!   defaults.
//! - [`Request`] / [`Prompt`]: token ids (hashed into chained 512-token block
//!   hashes, [`block_hashes`]) or precomputed block hashes.
//! - [`EffectiveState`]: what a policy sees of an instance, with the fields
//!   that came from real state and their age.
//! - [`Clock`]: where the router reads the time (`CLOCK_MONOTONIC`, or a
//!   simulator's clock through [`Router::with_clock`]).
//! - [`Router::migration_advice_for`] / [`Router::migrate_reservation`]: the
//!   migration trigger and target scorer for a request a pick reserved (its
//!   own reservation left out of its instance's load);
//!   [`Router::migration_advice`] / [`Router::migrate`] for one not yet
//!   reserved (an error for a request id reserved on the named instance);
//!   [`DecisionLog`]: optional JSON Lines decision records.
//!
//! Layout: `settings` (policies, thresholds), `request` (prompt hashing, with
//! `engine_state_shm_format::blocks`, the hash engines publish their cache
//! by), `lru` and `shadow` (per-instance accounting), `effective` (real
//! state and the merge), `feed` (a reader's status → fresh or not), `clock`
//! (the time source), `policy` and `migration` (pure decision functions),
//! `state`, `router`, `decide` and `reservation` (the locked state, one
//! decision under the lock, and the handles), `decision` (what was decided
//! and why), `decision_log` (its JSON Lines records), `error`.
//!
//! ```
//! use std::time::Duration;
//! use engine_state_router::{Policy, RealState, Request, Router, RouterSettings};
//! use engine_state_shm_format::Snapshot;
//!
//! let settings = RouterSettings { policy: Policy::Unified, ..RouterSettings::default() };
//! let router = Router::with_instances(settings, ["engine-0", "engine-1"])?;
//!
//! // engine-0 is busy by its own (fresh) account; the router's shadow knows nothing yet.
//! let busy = Snapshot { num_running: 6, pending_prefill_tokens: 40_000, ..Snapshot::default() };
//! router.update_real_state([("engine-0", RealState::fresh(busy, Duration::from_millis(20)))]);
//!
//! let prompt: Vec<u32> = (0..2048).collect();
//! let request = Request::from_tokens("req-1", prompt).with_session("chat-42");
//! let (decision, mut reservation) = router.pick(&request)?;
//! assert_eq!(decision.instance_id, "engine-1");
//!
//! reservation.prefill_done(); // first token streamed
//! reservation.complete(); // or fail(), or just drop it
//! assert_eq!(router.instance("engine-1").unwrap().shadow.num_requests, 0);
//! # Ok::<(), engine_state_router::Error>(())
//! ```

mod clock;
mod decide;
mod decision;
mod decision_log;
mod effective;
mod error;
mod feed;
mod headers;
mod lru;
mod migration;
mod peers;
mod policy;
mod request;
mod reservation;
mod router;
mod settings;
mod shadow;
mod state;
mod text;

pub use crate::clock::Clock;
pub use crate::decision::{Decision, Reason};
pub use crate::decision_log::DecisionLog;
pub use crate::effective::{EffectiveState, RealFields, RealState, RealUsed};
pub use crate::error::Error;
pub use crate::headers::{ENGINE_HEADER, SESSION_HEADER};
pub use crate::migration::MigrationAdvice;
pub use crate::peers::{PeerReservations, ReservationSink};
pub use crate::request::{Prompt, Request};
pub use crate::reservation::Reservation;
pub use crate::router::{InstanceView, Router, RouterStats};
pub use crate::settings::{
    CacheKnowledge, MigrationSettings, Policy, RealStateUse, RouterSettings,
};
pub use crate::shadow::ShadowCounters;
pub use crate::text::{chat_prompt, text_token_ids};
pub use engine_state_shm_format::blocks::{block_hashes, BLOCK_TOKENS};
/// An engine's cache digest real state carries (re-exported from `engine-state-shm-format`).
pub use engine_state_shm_format::CacheDigest;
/// The engine snapshot real state carries (re-exported from `engine-state-shm-format`).
pub use engine_state_shm_format::Snapshot;

/// A small deterministic generator for tests: `next(bound)` is in
/// `0..bound` (xorshift64; `seed` must not be 0).
#[cfg(test)]
pub(crate) fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed;
    move |bound| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    }
}
