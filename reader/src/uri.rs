//! Where engine state lives: `file://` directories and `redis://` servers
//! (docs/ARCHITECTURE.md, "Crates"). The parser is `engine-state-settings`'
//! (`settings/src/uri.rs`); with the `redis` feature its Redis part is
//! `engine-state-redis`' `RedisTarget`, without it a Redis URI is refused
//! with advice.

#[cfg(feature = "redis")]
pub use engine_state_redis::StateUri;
/// A parsed engine-state URI (this build has no Redis support: only
/// `StateUri::Shm` can be made).
#[cfg(not(feature = "redis"))]
pub type StateUri = engine_state_settings::StateUri<engine_state_settings::NoRedis>;

pub use engine_state_settings::{BadUri, DEFAULT_URI, URI_ENV};

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "redis")]
    #[test]
    fn parses_redis_uris_and_hides_passwords() {
        let uri = StateUri::parse("redis://user:s3cret@10.0.0.1:6379/2").unwrap();
        assert!(matches!(uri, StateUri::Redis { .. }));
        assert_eq!(uri.to_string(), "redis://user:***@10.0.0.1:6379/2");
        assert!(!format!("{uri:?}").contains("s3cret"));
        assert!(!format!(
            "{}",
            StateUri::parse("redis://:pw@h:1/0?prefix=p:").unwrap()
        )
        .contains("pw"));
    }

    #[cfg(feature = "redis")]
    #[test]
    fn a_redis_uri_is_checked_at_parse_time() {
        let err = StateUri::parse("redis://:s3cret@h:1/notadb")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad engine-state URI"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[cfg(not(feature = "redis"))]
    #[test]
    fn without_the_redis_feature_a_redis_uri_is_refused_with_advice() {
        let err = StateUri::parse("redis://h:1/0").unwrap_err().to_string();
        assert!(err.contains("`redis`"), "{err}");
    }

    #[test]
    fn a_bad_uri_is_the_readers_bad_uri() {
        let err = crate::Error::from(StateUri::parse("nope").unwrap_err());
        assert!(matches!(err, crate::Error::BadUri { .. }), "{err:?}");
    }
}
