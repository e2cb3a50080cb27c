//! Where the router reads the time: `CLOCK_MONOTONIC` in production, any
//! nanosecond source in a simulation. The type is shm-format's
//! (`shm-format/src/clock.rs`), shared with the publisher: one owner.

pub use engine_state_shm_format::Clock;
