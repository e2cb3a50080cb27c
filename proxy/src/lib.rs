//! `esroute`: an OpenAI-compatible routing proxy on the engine-state router
//! (docs/ROUTING.md, "A request's lifecycle").
//!
//! A client sends `POST /v1/completions` (or `/v1/chat/completions`) to the
//! proxy; the proxy reads the prompt as token ids ([`prompt_tokens`]; text
//! through [`text_tokens`], a documented deterministic mapping), asks the
//! [`Router`](engine_state_router::Router) to pick an engine and reserve the
//! request on it, forwards the body unchanged to that engine's URL and
//! streams the response back chunk by chunk. The reservation follows the
//! stream: `prefill_done` at the first chunk, `complete` at its end, `fail`
//! on an upstream error or timeout, and a client that goes away drops the
//! stream and with it the reservation — no path keeps one.
//!
//! - Bounds: the request body by [`Config::max_body_bytes`] (413 above it),
//!   the request head by hyper's defaults (at most 100 headers and about
//!   400 KiB: 431 above them); responses name their engine in
//!   `x-esroute-engine`.
//! - [`Config`] / [`EngineSpec`]: what the binary's flags become.
//! - [`run`]: serve until a shutdown future resolves, then drain in-flight
//!   streams (the binary passes SIGTERM/Ctrl-C; tests their own future).
//! - A background thread feeds the router engine state every 50 ms
//!   (`update_from_reading`, with cache digests) and, with shared
//!   reservations, the peers' (`update_from_replicas`).
//!
//! Layout: `config` (settings and engine list), `prompt` (token ids from a
//! request body), `feed` (the engine-state poller and engine health),
//! `stream` (the response body that carries the reservation), `metrics`
//! (the Prometheus families), `server` (the routes), `error`.
//!
//! ```
//! let tokens = engine_state_proxy::text_tokens("hello world");
//! assert_eq!(tokens.len(), "hello world".len()); // one token per byte
//! ```

mod config;
mod error;
mod feed;
mod metrics;
mod prompt;
mod server;
mod stream;

pub use crate::config::{Config, EngineSpec};
pub use crate::error::Error;
pub use crate::metrics::RESERVATIONS_HELD;
pub use crate::prompt::{prompt_tokens, text_tokens, RoutedPrompt};
pub use crate::server::{run, serve};
