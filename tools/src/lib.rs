//! The engine-state command-line tools, as libraries so tests can drive them.
//!
//! - [`esdump`]: prints every engine's live state as a table, as JSON, or as a
//!   `top`-like view that refreshes in place.
//! - [`espublish`]: publishes synthetic engine state (fixed fields, or a
//!   self-checking stress payload) for testing readers and routers without vLLM.
//!
//! The binaries only parse flags and turn [`anyhow::Result`] into an exit code.

pub mod esdump;
pub mod espublish;
mod table;
