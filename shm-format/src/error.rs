//! The one error type of this crate. Every message says what to do next.

use std::io;
use std::path::PathBuf;

/// Errors from creating, opening and validating engine-state files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine id is not a valid file name / key suffix.
    #[error(
        "invalid engine id {id:?}: {reason}; use 1 to 63 characters of [A-Za-z0-9._-], not starting \
         with '.' (set AGENTIC_WORKER_ID or pass engine_id)"
    )]
    InvalidEngineId {
        /// The refused id, escaped for display.
        id: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A system call on a path failed.
    #[error("could not {action} {}: {io}{hint}", path.display())]
    Io {
        /// What was being done ("open", "create", "map", ...).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        io: io::Error,
        /// A hint on what to do, possibly empty.
        hint: &'static str,
    },
    /// The file does not start with the engine-state magic.
    #[error(
        "{} is not an engine-state file (bad magic); remove it from the engine-state directory",
        path.display()
    )]
    NotEngineState {
        /// The foreign file.
        path: PathBuf,
    },
    /// A directory entry that readers refuse to open: a symbolic link (never
    /// followed), a FIFO, socket, device or directory (opening those can block
    /// or has side effects), or a name that is not UTF-8 (so no engine id).
    #[error(
        "{what}: {}; engine-state opens only regular files named after an engine id, and \
         never follows links: remove it from the engine-state directory",
        path.display()
    )]
    RefusedEntry {
        /// The entry.
        path: PathBuf,
        /// What it is: "symbolic link, not followed", "not a regular file (a FIFO)", ...
        what: String,
    },
    /// The file has a layout version this build does not know.
    #[error(
        "{} has layout version {found}, but this build reads version {supported}; upgrade \
         engine-state on this side (or downgrade the writer) so both use the same layout",
        path.display()
    )]
    UnknownVersion {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this build supports.
        supported: u32,
    },
    /// The file is shorter or longer than a layout-version-1 file.
    #[error(
        "{} is {size} bytes, but an engine-state file is {expected} bytes (truncated, or not an \
         engine-state file); remove it (a restarted publisher creates a new one)",
        path.display()
    )]
    WrongSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The size of a valid file.
        expected: u64,
    },
    /// The header is inconsistent with layout version 1.
    #[error(
        "{} has a corrupt header ({what}); remove it (a restarted publisher creates a new one)",
        path.display()
    )]
    CorruptHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Another live process already publishes this engine id.
    #[error(
        "engine id {engine_id:?} is already published by a live process (pid {pid} in its \
         namespace) at {}; give this engine another id (AGENTIC_WORKER_ID) or stop the other \
         publisher",
        path.display()
    )]
    AlreadyPublished {
        /// The contested id.
        engine_id: String,
        /// The live file.
        path: PathBuf,
        /// The other writer's pid, as recorded in its header.
        pid: u32,
    },
    /// Another live process publishes this engine id, but its file was
    /// truncated or grown under it (so its header cannot be read). That
    /// writer's heartbeat thread replaces the file within a few periods.
    #[error(
        "engine id {engine_id:?} is published by a live process, but its file {} is {size} bytes \
         instead of {expected} (another process truncated it); that publisher replaces the file \
         within a few heartbeat periods; give this engine another id (AGENTIC_WORKER_ID) or stop \
         the other publisher",
        path.display()
    )]
    LiveFileWrongSize {
        /// The contested id.
        engine_id: String,
        /// The live writer's file.
        path: PathBuf,
        /// Its size now.
        size: u64,
        /// The size of a valid file.
        expected: u64,
    },
}

/// The action of a reader opening an engine file (its permission hint is about
/// read access, not write access).
pub(crate) const OPEN_FOR_READING: &str = "open for reading";

impl Error {
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, io: io::Error) -> Error {
        let hint = match io.kind() {
            io::ErrorKind::NotFound if action == "read directory" => {
                "; create it, or point AGENTIC_ENGINE_STATE_URI / --uri at the directory the \
                 engines publish into"
            }
            io::ErrorKind::NotFound => "; check the path (AGENTIC_ENGINE_STATE_URI / --uri)",
            _ if action == "use as a directory" => {
                "; remove that file, or point AGENTIC_ENGINE_STATE_URI / --uri at a directory"
            }
            io::ErrorKind::PermissionDenied if action == OPEN_FOR_READING => {
                "; a reader needs read access to the engine files: run it as a user that may read \
                 them, or have the publishers create them readable by others \
                 (AGENTIC_ENGINE_STATE_FILE_MODE=644)"
            }
            io::ErrorKind::PermissionDenied => {
                "; run as a user that may write there, or choose another directory \
                 (AGENTIC_ENGINE_STATE_URI / --uri)"
            }
            _ if io.raw_os_error() == Some(nix::libc::ENOSPC) => {
                "; the shared-memory filesystem is full: free space in it or enlarge it"
            }
            _ => "",
        };
        Error::Io {
            action,
            path: path.into(),
            io,
            hint,
        }
    }
}
