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

impl EngineSpec {
    /// An engines file's text: one `ID=URL` a line (each as
    /// [`EngineSpec::from_str`]), `#` comments and blank lines ignored; an
    /// error names `source` (the file) and the line number.
    pub fn parse_list(text: &str, source: &str) -> Result<Vec<EngineSpec>, Error> {
        let mut engines = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line
                .split_once('#')
                .map_or(line, |(before, _)| before)
                .trim();
            if line.is_empty() {
                continue;
            }
            let spec = line.parse().map_err(|error: Error| {
                Error::Config(format!("{source}, line {}: {error}", number + 1))
            })?;
            engines.push(spec);
        }
        Ok(engines)
    }

    /// Refuses an engine id given twice (over `--engine` and `--engines-file`).
    pub fn check_unique(engines: &[EngineSpec]) -> Result<(), Error> {
        let mut seen = std::collections::HashSet::new();
        for engine in engines {
            if !seen.insert(engine.id.as_str()) {
                return Err(Error::Config(format!(
                    "engine id {:?} is given twice (--engine, --engines-file): give each engine once",
                    engine.id
                )));
            }
        }
        Ok(())
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

    #[test]
    fn engines_files_skip_comments_and_name_bad_lines() {
        let text = "# the fleet\nsim-0=http://127.0.0.1:8000\n\n  sim-1=http://127.0.0.1:8001/  # second\n";
        let engines = EngineSpec::parse_list(text, "fleet.txt").unwrap();
        let ids: Vec<&str> = engines.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["sim-0", "sim-1"]);
        assert_eq!(engines[1].url, "http://127.0.0.1:8001");
        let error = EngineSpec::parse_list("a=http://a:1\n\nb=https://b:1\n", "fleet.txt")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("fleet.txt, line 3: "), "{error}");
        assert!(error.contains("TLS"), "{error}");
        let twice = EngineSpec::parse_list("a=http://a:1\na=http://b:1", "f").unwrap();
        let error = EngineSpec::check_unique(&twice).unwrap_err().to_string();
        assert!(error.contains("\"a\" is given twice"), "{error}");
    }
}
