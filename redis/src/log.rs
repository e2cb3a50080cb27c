//! Where this crate's messages go: through `tracing` when the program has
//! installed a subscriber (esagent: levels, `RUST_LOG`, one format), else
//! straight to stderr (engines, the Python module and the tools install
//! none, and a message nobody sees is the failure this avoids).

/// A warning: what went wrong and what to do, without credentials (a
/// target prints without its password).
pub(crate) fn warn(message: std::fmt::Arguments<'_>) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{message}");
    } else {
        eprintln!("{message}");
    }
}
