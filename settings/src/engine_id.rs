//! The engine-id rule (README.md, "Configuration"), the one every publisher
//! follows, the vLLM hook included (it calls this through
//! `engine_state._native`).
//!
//! `AGENTIC_WORKER_ID` when set; with `-dp<index>` appended for a vLLM
//! engine of a server that runs several data-parallel engines (they share
//! the environment), the worker id's end cut so that the whole is at most
//! 63 characters (`MAX_ENGINE_ID_LEN`). Otherwise `<host>-<pid>`, and `<host>-dp<index>-<pid>`
//! for a vLLM engine: the pid keeps several processes on one host apart.
//! `<host>` is the hostname with every character an engine id does not allow
//! replaced by `_`, without leading or trailing dots, at most 40 characters
//! (`host` if nothing is left).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use engine_state_shm_format::MAX_ENGINE_ID_LEN;

/// Longest hostname part of a default id.
const MAX_HOST_LEN: usize = 40;

/// A vLLM engine's place among the data-parallel engines of its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataParallel {
    /// This engine's data-parallel rank.
    pub index: u32,
    /// How many data-parallel engines the server runs.
    pub size: u32,
}

/// The engine id by the rule above, from `worker_id` (the value of
/// `AGENTIC_WORKER_ID`, if any; surrounding blanks ignored), `host` and `pid`.
pub fn engine_id(
    worker_id: Option<&str>,
    data_parallel: Option<DataParallel>,
    host: &str,
    pid: u32,
) -> String {
    if let Some(worker_id) = worker_id.map(str::trim).filter(|w| !w.is_empty()) {
        return match data_parallel {
            // A worker id that fits alone is shortened to fit the suffix:
            // the suffix is ours, and must not make a valid id invalid. One
            // too long by itself is left so, for the id check to refuse.
            // Two worker ids equal up to the cut give one id: the second
            // writer is refused as a duplicate (README, engine id), which is
            // simpler to explain than a hash suffix and never silent.
            Some(dp) if dp.size > 1 && worker_id.len() <= MAX_ENGINE_ID_LEN => {
                with_suffix(worker_id, &format!("-dp{}", dp.index))
            }
            Some(dp) if dp.size > 1 => format!("{worker_id}-dp{}", dp.index),
            _ => worker_id.to_owned(),
        };
    }
    let host = host_part(host);
    match data_parallel {
        Some(dp) => format!("{host}-dp{}-{pid}", dp.index),
        None => format!("{host}-{pid}"),
    }
}

/// `<host>-<pid>` for this process: the id of a publisher given none and
/// no `AGENTIC_WORKER_ID`.
pub fn default_engine_id() -> String {
    engine_id(None, None, &hostname(), std::process::id())
}

/// This host's name (`host` if it cannot be read).
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".to_owned())
}

/// The id to publish under when `engine_id` is already published by another
/// live process: `<engine_id>-<pid>` (with 4 random hex digits more when
/// `engine_id` already ends with `-<pid>`), `engine_id` shortened so that
/// the whole fits an engine id.
pub fn fallback_engine_id(engine_id: &str, pid: u32) -> String {
    let mut suffix = format!("-{pid}");
    if engine_id.ends_with(&suffix) {
        let random = RandomState::new().build_hasher().finish() as u16;
        suffix.push_str(&format!("-{random:04x}"));
    }
    with_suffix(engine_id, &suffix)
}

/// `base` + `suffix`, `base` cut at the end so that the whole is at most an
/// engine id's length.
fn with_suffix(base: &str, suffix: &str) -> String {
    let mut keep = MAX_ENGINE_ID_LEN
        .saturating_sub(suffix.len())
        .min(base.len());
    while !base.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{suffix}", &base[..keep])
}

/// The hostname as an engine id's first part.
fn host_part(host: &str) -> String {
    let cleaned: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let trimmed: String = cleaned
        .trim_matches('.')
        .chars()
        .take(MAX_HOST_LEN)
        .collect();
    if trimmed.is_empty() {
        "host".to_owned()
    } else {
        trimmed
    }
}

#[cfg(test)]
mod tests {
    use engine_state_shm_format::EngineId;

    use super::*;

    const DP1: Option<DataParallel> = Some(DataParallel { index: 0, size: 1 });

    #[test]
    fn the_default_is_host_and_pid() {
        assert_eq!(
            engine_id(None, None, "gpu-7.example", 42),
            "gpu-7.example-42"
        );
        assert_eq!(
            engine_id(None, DP1, "gpu-7.example", 42),
            "gpu-7.example-dp0-42"
        );
        let dp3 = Some(DataParallel { index: 3, size: 4 });
        assert_eq!(engine_id(None, dp3, "h/x y", 9), "h_x_y-dp3-9");
        assert_eq!(engine_id(Some("  "), None, ".host.", 1), "host-1");
        assert_eq!(engine_id(None, None, "...", 1), "host-1");
        let id = default_engine_id();
        assert!(EngineId::new(&id).is_ok(), "{id}");
        assert!(id.ends_with(&format!("-{}", std::process::id())));
    }

    #[test]
    fn the_worker_id_wins_and_keeps_data_parallel_engines_apart() {
        assert_eq!(engine_id(Some(" w1 "), None, "h", 1), "w1");
        assert_eq!(engine_id(Some("w1"), DP1, "h", 1), "w1");
        let dp2 = Some(DataParallel { index: 2, size: 4 });
        assert_eq!(engine_id(Some("w1"), dp2, "h", 1), "w1-dp2");
    }

    #[test]
    fn a_long_worker_id_is_cut_so_its_data_parallel_suffix_fits() {
        let dp = |index| Some(DataParallel { index, size: 1024 });
        let base = "w".repeat(62);
        let id = engine_id(Some(&base), dp(3), "h", 1);
        assert_eq!(id, format!("{}-dp3", "w".repeat(59)));
        let id = engine_id(Some(&"w".repeat(63)), dp(1023), "h", 1);
        assert_eq!(id.len(), MAX_ENGINE_ID_LEN);
        assert!(id.ends_with("-dp1023"), "{id}");
        for length in 1..=MAX_ENGINE_ID_LEN {
            for index in [0, 9, 10, 1023, u32::MAX] {
                let id = engine_id(Some(&"w".repeat(length)), dp(index), "h", 1);
                assert!(EngineId::new(&id).is_ok(), "{length} {index}: {id}");
                assert!(id.ends_with(&format!("-dp{index}")), "{id}");
            }
        }
        // Too long by itself: left for the id check to refuse, not cut.
        let id = engine_id(Some(&"w".repeat(64)), dp(0), "h", 1);
        assert!(EngineId::new(&id).is_err(), "{id}");
        // Without data parallelism a worker id is used as given.
        assert_eq!(engine_id(Some(&base), DP1, "h", 1), base);
    }

    #[test]
    fn long_hostnames_still_make_valid_ids() {
        let dp = Some(DataParallel {
            index: 1023,
            size: 1024,
        });
        let id = engine_id(None, dp, &"h".repeat(100), 4_194_304);
        assert!(EngineId::new(&id).is_ok(), "{id}");
    }

    #[test]
    fn fallbacks_fit_and_differ() {
        assert_eq!(fallback_engine_id("same", 7), "same-7");
        let again = fallback_engine_id("host-dp0-7", 7);
        assert!(again.starts_with("host-dp0-7-7-") && again.len() == "host-dp0-7-7-".len() + 4);
        let long = fallback_engine_id(&"e".repeat(63), 4_194_304);
        assert_eq!(long.len(), 63);
        assert!(EngineId::new(&long).is_ok(), "{long}");
        assert!(long.ends_with("-4194304"));
    }
}
