//! What the proxy is configured with: the engines and the router settings.

use std::str::FromStr;
use std::time::Duration;

use engine_state_reader::StateUri;
use engine_state_router::RouterSettings;

use crate::error::Error;

/// One engine: its id (the engine-state engine id, the router's instance id)
/// and the base URL requests are forwarded to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSpec {
    /// The engine id.
    pub id: String,
    /// `http://host:port` (no path, no TLS).
    pub url: String,
}

impl FromStr for EngineSpec {
    type Err = Error;

    /// `ID=URL`, e.g. `sim-0=http://127.0.0.1:8000`.
    fn from_str(text: &str) -> Result<EngineSpec, Error> {
        let bad = |reason: &str| Error::BadEngine {
            value: text.to_owned(),
            reason: reason.to_owned(),
        };
        let (id, url) = text
            .split_once('=')
            .ok_or_else(|| bad("expected ID=URL, e.g. sim-0=http://127.0.0.1:8000"))?;
        if id.is_empty() {
            return Err(bad("the engine id before '=' is empty"));
        }
        let url = url.trim_end_matches('/');
        let uri: hyper::Uri = url
            .parse()
            .map_err(|_| bad("the URL after '=' does not parse"))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(bad(
                "the URL must be http://host:port (TLS is not supported)",
            ));
        }
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(bad(
                "the URL must have no path: requests keep theirs (/v1/completions)",
            ));
        }
        Ok(EngineSpec {
            id: id.to_owned(),
            url: url.to_owned(),
        })
    }
}

/// Everything [`run`](crate::run) needs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The engines, in the router's tie-break order.
    pub engines: Vec<EngineSpec>,
    /// The router's settings.
    pub settings: RouterSettings,
    /// Where engine state is read (`None`: no engine state, shadow counters
    /// alone).
    pub state_uri: Option<StateUri>,
    /// This replica's id; with `share_reservations` its reservations are
    /// published under it and the other replicas' are read.
    pub replica_id: Option<String>,
    /// Share reservations with the other replicas at `state_uri`.
    pub share_reservations: bool,
    /// How often engine state (and the peers) are read.
    pub poll_interval: Duration,
    /// Largest request body accepted (larger: 413).
    pub max_body_bytes: usize,
    /// Connecting to an engine.
    pub connect_timeout: Duration,
    /// Waiting for the engine's response head, and between two chunks.
    pub read_timeout: Duration,
    /// After shutdown is asked, in-flight streams get this long to finish.
    pub drain_timeout: Duration,
    /// An engine whose connection failed is retried (by `GET /health`) this often.
    pub health_retry: Duration,
}

impl Config {
    /// A configuration with the defaults of the binary's flags.
    pub fn new(engines: Vec<EngineSpec>) -> Config {
        Config {
            engines,
            settings: RouterSettings::default(),
            state_uri: None,
            replica_id: None,
            share_reservations: false,
            poll_interval: Duration::from_millis(50),
            max_body_bytes: 8 << 20,
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(30),
            health_retry: Duration::from_secs(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_specs_parse_and_refuse_with_reasons() {
        let spec: EngineSpec = "sim-0=http://127.0.0.1:8000/".parse().unwrap();
        assert_eq!(spec.id, "sim-0");
        assert_eq!(spec.url, "http://127.0.0.1:8000");
        for bad in [
            "sim-0",
            "=http://a:1",
            "a=https://a:1",
            "a=http://a:1/v1",
            "a=nope",
        ] {
            assert!(bad.parse::<EngineSpec>().is_err(), "{bad}");
        }
    }
}
