//! Engine ids: file names in the shared-memory directory and Redis key suffixes.

use std::fmt;

use crate::error::Error;

/// Longest engine id, in bytes.
pub const MAX_ENGINE_ID_LEN: usize = 63;

/// A validated engine id: 1 to 63 characters of `[A-Za-z0-9._-]`, not starting
/// with `.` (that excludes `.` and `..`, and leaves dot-names free for the
/// writer's temporary files).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EngineId(String);

impl EngineId {
    /// Validates `id`.
    pub fn new(id: &str) -> Result<EngineId, Error> {
        let reason = if id.is_empty() {
            Some("it is empty")
        } else if id.len() > MAX_ENGINE_ID_LEN {
            Some("it is longer than 63 characters")
        } else if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            Some("it has characters outside [A-Za-z0-9._-]")
        } else if id.starts_with('.') {
            Some("it starts with '.'")
        } else {
            None
        };
        match reason {
            None => Ok(EngineId(id.to_owned())),
            Some(reason) => Err(Error::InvalidEngineId {
                id: id.escape_debug().to_string(),
                reason,
            }),
        }
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id's bytes, NUL padded to the file's engine id field.
    pub(crate) fn to_field(&self) -> [u8; crate::layout::ENGINE_ID_FIELD_SIZE] {
        let mut field = [0u8; crate::layout::ENGINE_ID_FIELD_SIZE];
        field[..self.0.len()].copy_from_slice(self.0.as_bytes());
        field
    }

    /// Parses the file's NUL-padded engine id field.
    pub(crate) fn from_field(field: &[u8]) -> Result<EngineId, Error> {
        let len = field.iter().position(|b| *b == 0).unwrap_or(field.len());
        let id = std::str::from_utf8(&field[..len]).unwrap_or("<not UTF-8>");
        EngineId::new(id)
    }
}

impl fmt::Display for EngineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for EngineId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for EngineId {
    type Err = Error;
    fn from_str(s: &str) -> Result<EngineId, Error> {
        EngineId::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        for id in ["a", "engine-0", "host_1.dp3", "A.b-c_9", &"x".repeat(63)] {
            assert_eq!(EngineId::new(id).unwrap().as_str(), id);
        }
    }

    #[test]
    fn refuses_traversal_empty_long_and_odd_characters() {
        for (id, reason) in [
            ("", "empty"),
            ("../x", "characters outside"),
            ("..", "starts with '.'"),
            (".", "starts with '.'"),
            (".hidden", "starts with '.'"),
            ("a/b", "characters outside"),
            ("a b", "characters outside"),
            ("é", "characters outside"),
            ("a\0b", "characters outside"),
        ] {
            let err = EngineId::new(id).unwrap_err().to_string();
            assert!(err.contains(reason), "{id:?}: {err}");
            assert!(err.contains("AGENTIC_WORKER_ID"), "{err}");
        }
        let err = EngineId::new(&"x".repeat(64)).unwrap_err().to_string();
        assert!(err.contains("longer than 63"), "{err}");
    }

    #[test]
    fn field_round_trip() {
        let id = EngineId::new("engine-7").unwrap();
        let field = id.to_field();
        assert_eq!(&field[..8], b"engine-7");
        assert!(field[8..].iter().all(|b| *b == 0));
        assert_eq!(EngineId::from_field(&field).unwrap(), id);
    }
}
