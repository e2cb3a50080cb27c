//! The one error type of this crate. Every message says what to do next.

/// Errors from configuring the router and from asking it to route.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is out of its range.
    #[error("invalid router setting {name} = {value}: expected {expected}")]
    InvalidSetting {
        /// The setting's field name.
        name: &'static str,
        /// The refused value, as text.
        value: String,
        /// What would be accepted.
        expected: String,
    },
    /// A decision was asked of a router with no instances.
    #[error("the router has no instances; add one with Router::add_instance before picking")]
    NoInstances,
    /// Every instance's fresh state says it is shutting down: there is
    /// nowhere to send a new request.
    #[error(
        "every instance is shutting down (flag in its fresh engine state); \
         add a running instance with Router::add_instance, or retry when one is back"
    )]
    AllShuttingDown,
    /// An instance id the router does not know.
    #[error("unknown instance {0:?}; add it with Router::add_instance first")]
    UnknownInstance(String),
    /// An instance id that is already present.
    #[error("instance {0:?} is already routed to; remove it first to replace it")]
    DuplicateInstance(String),
    /// A request that cannot be routed as given.
    #[error("invalid request {request_id:?}: {reason}")]
    InvalidRequest {
        /// The request's id.
        request_id: String,
        /// What is wrong with it and how to fix it.
        reason: String,
    },
    /// A reservation made by another router (another `Router::new`, not a
    /// clone) was passed to this one; nothing was changed on either.
    #[error(
        "the reservation of request {request_id:?} was made by another router (router id \
         {reservation_router}, this is {router}): pass it to the router whose pick made it"
    )]
    ForeignReservation {
        /// The request's id.
        request_id: String,
        /// The id of the router that made the reservation.
        reservation_router: u64,
        /// The id of the router it was passed to.
        router: u64,
    },
    /// The decision log file could not be opened.
    #[error(
        "could not open decision log {path}: {source}; check the directory exists and is writable"
    )]
    DecisionLog {
        /// The path given.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}
