//! HTTP header names of the routing proxy (`esroute`), one owner for it and
//! for its clients (`essim replay`).

/// The request header a client names its session by (esroute: else the
/// body's `session_id`).
pub const SESSION_HEADER: &str = "x-session-id";

/// The response header naming the engine the proxy routed a request to.
pub const ENGINE_HEADER: &str = "x-esroute-engine";
