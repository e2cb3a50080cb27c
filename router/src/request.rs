//! What a caller asks the router to place.

use std::borrow::Cow;

use crate::error::Error;
use engine_state_shm_format::blocks::{block_hashes, BLOCK_TOKENS};

/// A request's prompt: token ids, or block hashes computed elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Token ids; the router hashes the full 512-token blocks itself.
    Tokens(Vec<u32>),
    /// Precomputed chained block hashes (one per full 512-token block, each
    /// chaining its predecessor, as [`block_hashes`] makes them) and the
    /// prompt length in tokens. Any chained hash works (vLLM's own block
    /// hashes, say) as long as every request uses the same one: the cache-hit
    /// estimate relies on a block's hash determining its whole prefix.
    BlockHashes {
        /// One chained hash per full block, leading block first.
        block_hashes: Vec<u64>,
        /// Prompt length in tokens (at least `512 × block_hashes.len()`).
        input_len: u64,
    },
}

/// One request to route: owned and `Clone` so bindings can hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The caller's id for the request (logged, never interpreted).
    pub request_id: String,
    /// The conversation/agent session it belongs to, if any.
    pub session_id: Option<String>,
    /// The prompt.
    pub prompt: Prompt,
}

impl Request {
    /// A request given as token ids.
    pub fn from_tokens(request_id: impl Into<String>, tokens: Vec<u32>) -> Request {
        Request {
            request_id: request_id.into(),
            session_id: None,
            prompt: Prompt::Tokens(tokens),
        }
    }

    /// A request given as precomputed block hashes and its length in tokens.
    pub fn from_block_hashes(
        request_id: impl Into<String>,
        block_hashes: Vec<u64>,
        input_len: u64,
    ) -> Request {
        Request {
            request_id: request_id.into(),
            session_id: None,
            prompt: Prompt::BlockHashes {
                block_hashes,
                input_len,
            },
        }
    }

    /// The same request, in a session.
    pub fn with_session(mut self, session_id: impl Into<String>) -> Request {
        self.session_id = Some(session_id.into());
        self
    }

    /// Prompt length in tokens.
    pub fn input_len(&self) -> u64 {
        match &self.prompt {
            Prompt::Tokens(tokens) => tokens.len() as u64,
            Prompt::BlockHashes { input_len, .. } => *input_len,
        }
    }

    /// The prompt reduced to what the policies use. Done before the router's
    /// lock is taken: hashing a long prompt is the slowest part of a decision
    /// and needs no shared state.
    pub(crate) fn hashed(&self) -> Result<HashedPrompt<'_>, Error> {
        match &self.prompt {
            Prompt::Tokens(tokens) => Ok(HashedPrompt {
                input_len: tokens.len() as u64,
                blocks: Cow::Owned(block_hashes(tokens)),
            }),
            Prompt::BlockHashes {
                block_hashes,
                input_len,
            } => {
                let covered = (block_hashes.len() as u64).saturating_mul(BLOCK_TOKENS as u64);
                if covered > *input_len {
                    return Err(Error::InvalidRequest {
                        request_id: self.request_id.clone(),
                        reason: format!(
                            "{} block hashes cover {covered} tokens but input_len is {input_len}; \
                             pass one hash per full 512-token block and the prompt's length",
                            block_hashes.len()
                        ),
                    });
                }
                Ok(HashedPrompt {
                    input_len: *input_len,
                    blocks: Cow::Borrowed(block_hashes),
                })
            }
        }
    }
}

/// A prompt as the policies see it.
#[derive(Debug)]
pub(crate) struct HashedPrompt<'a> {
    pub input_len: u64,
    pub blocks: Cow<'a, [u64]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_their_block_hashes_are_the_same_prompt() {
        let tokens: Vec<u32> = (0..1500).collect();
        let by_tokens = Request::from_tokens("a", tokens.clone());
        let by_hashes = Request::from_block_hashes("b", block_hashes(&tokens), 1500);
        let (x, y) = (by_tokens.hashed().unwrap(), by_hashes.hashed().unwrap());
        assert_eq!((x.input_len, &x.blocks[..]), (y.input_len, &y.blocks[..]));
        assert_eq!(x.blocks.len(), 2);
    }

    #[test]
    fn more_blocks_than_the_prompt_holds_is_refused() {
        let err = Request::from_block_hashes("r1", vec![1, 2], 1000)
            .hashed()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("cover 1024 tokens but input_len is 1000"),
            "{err}"
        );
    }
}
