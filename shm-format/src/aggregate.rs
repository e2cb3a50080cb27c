//! The snapshot's request sums (docs/FORMAT.md, "Snapshot words"): what one
//! running or waiting request adds to a [`Snapshot`] and its remaining
//! prefill (the idle flag from the counts: [`Snapshot::set_idle_from_counts`]). Written once for every producer of
//! snapshots: the vLLM hook's capture (`publisher-py/src/capture.rs` and `incremental.rs`,
//! per request, on vLLM's scheduler thread: no allocation here) and the
//! simulator's engine model (`sim/src/engine.rs`). It lives in `shm-format`
//! because the sums are sums into its [`Snapshot`], which both producers
//! already use (docs/ARCHITECTURE.md, "Where each concept lives").

use crate::snapshot::Snapshot;

/// The fields the request sums write ([`Snapshot::add_running`],
/// [`Snapshot::add_waiting`]), in word order: `request_fields!(callback)`
/// calls `callback!` with their names, for code that must name each (the
/// hook's `_RequestTotals` attributes). [`Snapshot::REQUEST_FIELDS`] is the
/// same list as text.
#[macro_export]
macro_rules! request_fields {
    ($callback:ident) => {
        $callback! {
            num_running,
            num_waiting,
            pending_prefill_tokens,
            ongoing_decode_tokens,
            num_prefilling,
            max_prefill_remaining,
            num_preempted,
        }
    };
}

macro_rules! request_field_names {
    ($($field:ident,)*) => {
        [$(stringify!($field)),*]
    };
}

/// The three token counts a request's remaining prefill is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTokens {
    /// The prompt's length (`num_prompt_tokens`).
    pub prompt: i64,
    /// Tokens computed so far (`num_computed_tokens`).
    pub computed: i64,
    /// Prompt and output tokens (`num_tokens`).
    pub tokens: i64,
}

impl RequestTokens {
    /// Prefill tokens the request still needs. Output tokens exist exactly
    /// when `tokens > prompt`, and the newest sampled token is decode work,
    /// not prefill. Floored at 0: with async scheduling `computed` can run
    /// one token ahead of `tokens`.
    #[inline]
    pub fn remaining_prefill(self) -> u64 {
        let remaining = if self.tokens > self.prompt {
            self.tokens - 1 - self.computed
        } else {
            self.prompt - self.computed
        };
        remaining.max(0) as u64
    }
}

/// What one waiting request adds to a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitingRequest {
    /// Its remaining prefill ([`RequestTokens::remaining_prefill`]).
    pub remaining_prefill: u64,
    /// It is waiting because it was preempted.
    pub preempted: bool,
}

impl Snapshot {
    /// The names of the fields the request sums write, in word order
    /// ([`request_fields!`]).
    pub const REQUEST_FIELDS: [&'static str; 7] = request_fields!(request_field_names);

    /// Adds one running request: counted, its remaining prefill summed; a
    /// request with prefill left is prefilling, any other adds its tokens to
    /// the decode load.
    #[inline]
    pub fn add_running(&mut self, request: RequestTokens) {
        let remaining = request.remaining_prefill();
        self.num_running += 1;
        self.add_prefill(remaining);
        if remaining > 0 {
            self.num_prefilling += 1;
        } else {
            self.ongoing_decode_tokens += request.tokens.max(0) as u64;
        }
    }

    /// Adds one waiting request: counted, its remaining prefill summed, and
    /// counted as preempted when it is.
    #[inline]
    pub fn add_waiting(&mut self, request: WaitingRequest) {
        self.num_waiting += 1;
        self.add_prefill(request.remaining_prefill);
        self.num_preempted += u64::from(request.preempted);
    }

    /// Adds the remaining prefill of one request (running or waiting) to the
    /// pending sum and the maximum. The incremental capture adds the
    /// remaining prefill of the waiting requests it caches this way, without
    /// counting them again.
    #[inline]
    pub fn add_prefill(&mut self, remaining: u64) {
        self.pending_prefill_tokens += remaining;
        self.max_prefill_remaining = self.max_prefill_remaining.max(remaining);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(prompt: i64, computed: i64, tokens: i64) -> RequestTokens {
        RequestTokens {
            prompt,
            computed,
            tokens,
        }
    }

    #[test]
    fn remaining_prefill_counts_the_prompt_then_the_output_but_the_newest_token() {
        assert_eq!(tokens(100, 0, 100).remaining_prefill(), 100);
        assert_eq!(tokens(100, 64, 100).remaining_prefill(), 36);
        // Prefill done, one token sampled: decoding.
        assert_eq!(tokens(100, 100, 101).remaining_prefill(), 0);
        // Preempted after 10 output tokens, recomputed from 0: the outputs
        // but the newest are prefill again.
        assert_eq!(tokens(100, 0, 110).remaining_prefill(), 109);
        // Async scheduling: computed one ahead of tokens.
        assert_eq!(tokens(100, 101, 100).remaining_prefill(), 0);
        assert_eq!(tokens(100, 102, 101).remaining_prefill(), 0);
    }

    #[test]
    fn running_and_waiting_requests_add_to_their_fields() {
        let mut s = Snapshot::default();
        s.add_running(tokens(100, 64, 100));
        s.add_running(tokens(50, 59, 60));
        s.add_waiting(WaitingRequest {
            remaining_prefill: 80,
            preempted: true,
        });
        s.add_waiting(WaitingRequest {
            remaining_prefill: 20,
            preempted: false,
        });
        let expected = Snapshot {
            num_running: 2,
            num_waiting: 2,
            pending_prefill_tokens: 36 + 80 + 20,
            ongoing_decode_tokens: 60,
            num_prefilling: 1,
            max_prefill_remaining: 80,
            num_preempted: 1,
            ..Snapshot::default()
        };
        assert_eq!(s, expected);
    }

    #[test]
    fn request_fields_are_the_fields_the_sums_write() {
        let mut s = Snapshot::default();
        s.add_running(tokens(10, 0, 10));
        s.add_running(tokens(10, 10, 11));
        s.add_waiting(WaitingRequest {
            remaining_prefill: 5,
            preempted: true,
        });
        let written: Vec<&str> = s
            .fields()
            .filter(|(_, v)| *v != 0)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(written, Snapshot::REQUEST_FIELDS);
    }
}
