//! The handle a pick returns: the request's share of an instance's shadow counters.

use std::sync::Arc;

use crate::router::Shared;
use crate::shadow::Load;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Prefill,
    Decode,
    Released,
}

/// A request's reservation on its instance.
///
/// [`prefill_done`](Reservation::prefill_done) moves its tokens from pending
/// prefill to decode; [`complete`](Reservation::complete) and
/// [`fail`](Reservation::fail) release everything it reserved. Dropping it
/// unreleased releases it too, so an error path or a cancelled task can never
/// leak load onto an instance. Every method is idempotent and takes `&mut
/// self` (not `self`), so bindings can hold it in an object and call it twice
/// harmlessly.
pub struct Reservation {
    shared: Arc<Shared>,
    instance_id: String,
    uid: u64,
    /// The instance's position at reservation; checked against `uid` before use.
    position_hint: usize,
    load: Load,
    /// Its request's id key (`state::request_key`), counted live on its
    /// instance until released.
    request_key: u64,
    phase: Phase,
}

/// A reservation as a decision sees it: where it is and what it holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldReservation {
    pub uid: u64,
    pub position_hint: usize,
    pub load: Load,
    pub request_key: u64,
    /// Its `prefill_done` was called.
    pub decoding: bool,
}

/// How a reservation ended, for [`crate::RouterStats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    Completed,
    Failed,
    Dropped,
}

impl Reservation {
    pub(crate) fn new(
        shared: Arc<Shared>,
        instance_id: String,
        uid: u64,
        position_hint: usize,
        load: Load,
        request_key: u64,
    ) -> Reservation {
        Reservation {
            shared,
            instance_id,
            uid,
            position_hint,
            load,
            request_key,
            phase: Phase::Prefill,
        }
    }

    /// The instance the request is reserved on.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The [`Router::id`](crate::Router::id) of the router that made it: only
    /// that router (or a clone) takes it in a call.
    pub fn router_id(&self) -> u64 {
        self.shared.router_id
    }

    /// Prompt tokens reserved.
    pub fn input_len(&self) -> u64 {
        self.load.input_len
    }

    /// Prefill tokens reserved (`input_len` minus the estimated cache hit).
    pub fn new_prefill_tokens(&self) -> u64 {
        self.load.new_prefill
    }

    /// `complete`, `fail` or a drop has released it.
    pub fn is_released(&self) -> bool {
        self.phase == Phase::Released
    }

    /// What it holds on its instance, for a decision that must leave it out
    /// (migration advice about this request); `None` once released.
    pub(crate) fn held(&self) -> Option<HeldReservation> {
        (self.phase != Phase::Released).then_some(HeldReservation {
            uid: self.uid,
            position_hint: self.position_hint,
            load: self.load,
            request_key: self.request_key,
            decoding: self.phase == Phase::Decode,
        })
    }

    /// Replace it by the reservation a migration made on the target. The
    /// migration already took this one's load off its instance, under the
    /// same lock hold as it reserved the new one, so nothing is released
    /// here.
    pub(crate) fn replace_by_migrated(&mut self, migrated: Reservation) {
        self.phase = Phase::Released;
        *self = migrated;
    }

    /// The prefill is done (first token out): move the request's tokens from
    /// pending prefill to decode. No-op after the first call or a release.
    pub fn prefill_done(&mut self) {
        if self.phase != Phase::Prefill {
            return;
        }
        self.phase = Phase::Decode;
        self.shared
            .with_shadow(self.uid, self.position_hint, |shadow| {
                shadow.prefill_done(self.load)
            });
    }

    /// The request finished: release everything reserved. No-op if released.
    pub fn complete(&mut self) {
        self.release(Ending::Completed);
    }

    /// The request failed: release everything reserved. No-op if released.
    pub fn fail(&mut self) {
        self.release(Ending::Failed);
    }

    fn release(&mut self, ending: Ending) {
        if self.phase == Phase::Released {
            return;
        }
        let decoding = self.phase == Phase::Decode;
        self.phase = Phase::Released;
        let load = self.load;
        self.shared.end_reservation(
            self.uid,
            self.position_hint,
            self.request_key,
            ending,
            |shadow| shadow.release(load, decoding),
        );
    }
}

/// Not derived: the shared state behind the handle is the whole router.
impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("router_id", &self.shared.router_id)
            .field("instance_id", &self.instance_id)
            .field("input_len", &self.load.input_len)
            .field("new_prefill_tokens", &self.load.new_prefill)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release(Ending::Dropped);
    }
}
