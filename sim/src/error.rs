//! The simulator's one error type.

use std::path::PathBuf;

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A trace file does not exist.
    #[error(
        "trace file {0} not found. The public traces (Mooncake synthetic, Azure conv) live in \
         ../shared/traces/ beside the repository, where essim looks by default when run from \
         the repository root; ../shared/traces/README.md names their sources \
         (kvcache-ai/Mooncake FAST25-release/traces/synthetic_trace.jsonl, \
         Azure/AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv). Pass --trace PATH, \
         or --format agentic for the built-in generator"
    )]
    MissingTrace(PathBuf),
    /// A trace line could not be parsed.
    #[error(
        "{path}:{line}: {reason} (fix the line, or pass --skip-bad to skip and count bad lines)"
    )]
    TraceLine {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting or configuration file is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The router refused a request or a setting.
    #[error("router: {0}")]
    Router(#[from] engine_state_router::Error),
}

impl SimError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> SimError {
        SimError::Io {
            path: path.into(),
            source,
        }
    }
}
