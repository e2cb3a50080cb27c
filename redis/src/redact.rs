//! Hiding the credentials of a URI: the rule lives in
//! `engine-state-settings` (`settings/src/redact.rs`), shared with every
//! other scheme; re-exported here for the Redis target and its users.

pub use engine_state_settings::{is_secret_parameter, redact};
