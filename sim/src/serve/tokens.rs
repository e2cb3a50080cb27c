//! Tokens of `essim serve`: text prompts become token ids one per UTF-8
//! byte (token id = the byte's value), chat messages a fixed template
//! first; generated tokens are lowercase letters (one byte each, so the
//! output, sent back as text, maps to the same token ids), chosen from the
//! prompt's tokens and the position alone (the same prompt always gets the
//! same output, like greedy decoding). Block hashes: the router's own
//! 512-token chain (`engine_state_shm_format::blocks`) and a 16-token chain
//! for the engine model's prefix cache, over the prompt and the output.

use engine_state_shm_format::blocks;

use crate::profile::KV_BLOCK_TOKENS;
use crate::trace::mix;

/// A text prompt's token ids: the router crate's mapping (one per UTF-8
/// byte), which `esroute` uses too.
pub use engine_state_router::text_token_ids as text_tokens;

/// One chat message.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, …
    pub role: String,
    /// Its text (a string; content parts are not supported).
    pub content: String,
}

/// The chat template (the router crate's, which `esroute` uses too).
pub fn chat_text(messages: &[Message]) -> String {
    engine_state_router::chat_prompt(
        messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str())),
    )
}

/// The seed a prompt's output is drawn from.
pub fn output_seed(prompt: &[u32]) -> u64 {
    prompt
        .iter()
        .fold(0x6f75_7470_7574, |h, &t| mix(h, u64::from(t)))
}

/// Generated token `k` (0-based) of a prompt with this seed: a letter's byte.
pub fn output_token(seed: u64, k: u64) -> u8 {
    b'a' + (mix(seed, k) % 26) as u8
}

/// The first `n` generated tokens.
pub fn output_tokens(seed: u64, n: u64) -> Vec<u32> {
    (0..n).map(|k| u32::from(output_token(seed, k))).collect()
}

/// Chained hashes of the full 16-token KV blocks of `tokens`.
pub fn kv_block_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut parent = 0x6b76_626c_6f63_6b73;
    tokens
        .chunks_exact(KV_BLOCK_TOKENS as usize)
        .map(|block| {
            parent = block.iter().fold(parent, |h, &t| mix(h, u64::from(t)));
            parent
        })
        .collect()
}

/// The router's hashes of the full 512-token blocks of `tokens`.
pub fn router_block_hashes(tokens: &[u32]) -> Vec<u64> {
    blocks::block_hashes(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_one_token_per_byte_and_output_is_deterministic_letters() {
        assert_eq!(text_tokens("hé"), vec![104, 0xc3, 0xa9]);
        let seed = output_seed(&[1, 2, 3]);
        assert_eq!(
            output_tokens(seed, 8),
            output_tokens(output_seed(&[1, 2, 3]), 8)
        );
        assert_ne!(
            output_tokens(seed, 8),
            output_tokens(output_seed(&[1, 2, 4]), 8)
        );
        assert!(output_tokens(seed, 100)
            .iter()
            .all(|&t| (u32::from(b'a')..=u32::from(b'z')).contains(&t)));
        let chat = chat_text(&[Message {
            role: "user".into(),
            content: "hi".into(),
        }]);
        assert_eq!(chat, "<|user|>\nhi\n<|assistant|>\n");
    }

    #[test]
    fn block_chains_cover_full_blocks_only_and_share_prefixes() {
        let a: Vec<u32> = (0..1100).collect();
        let mut b = a.clone();
        b[600] = 7;
        assert_eq!(kv_block_hashes(&a).len(), 1100 / 16);
        assert_eq!(router_block_hashes(&a).len(), 2);
        let (ka, kb) = (kv_block_hashes(&a), kv_block_hashes(&b));
        assert_eq!(ka[..37], kb[..37]);
        assert_ne!(ka[37], kb[37]);
        assert_eq!(router_block_hashes(&a)[0], router_block_hashes(&b)[0]);
        assert_ne!(router_block_hashes(&a)[1], router_block_hashes(&b)[1]);
    }
}
