//! The engine-state command-line tools, as libraries so tests can drive them.
//!
//! - [`esdump`]: prints every engine's live state as a table, as JSON, or as a
//!   `top`-like view that refreshes in place.
//! - [`cache_dump`]: `esdump --cache ENGINE`, one engine's cache digest.
//! - [`replicas_dump`]: `esdump --replicas`, the router replicas' shared
//!   reservations.
//! - [`espublish`]: publishes synthetic engine state (fixed fields, or a
//!   self-checking stress payload) for testing readers and routers without vLLM.
//!
//! The binaries only parse flags and turn [`anyhow::Result`] into an exit code.

pub mod cache_dump;
pub mod esdump;
pub mod espublish;
pub mod replicas_dump;
mod table;
