//! Prompts of `essim replay`: token `p` of request `i` is a function of
//! [`TraceRequest::token_content`] alone, so two prompts agree on a 16-token
//! block exactly where the trace's block hashes say they share it (and on a
//! 512-token router block likewise: router blocks are whole engine blocks).
//! A session stream (the agentic generator) splices in what the server
//! really generated: turn n+1's prompt starts with turn n's prompt and
//! turn n's real output (the session's context), the trace's own stream
//! tokens after it.

use serde::Serialize;

use crate::trace::{Content, TraceRequest};

/// How a prompt is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PromptKind {
    /// Token ids, a JSON list in `prompt`.
    Tokens,
    /// Text, one token per UTF-8 byte (the router crate's mapping,
    /// `engine_state_router::text_token_ids`).
    Text,
}

/// Which OpenAI route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions` (the text prompt as one user message).
    Chat,
}

impl Endpoint {
    /// The route's path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

/// Token ids of `--prompt tokens` lie in `TOKEN_BASE .. TOKEN_BASE +
/// TOKEN_SPAN`: above bytes and the usual special tokens, below every common
/// vocabulary size.
pub const TOKEN_BASE: u32 = 1_000;
/// See [`TOKEN_BASE`].
pub const TOKEN_SPAN: u32 = 30_000;
/// Bytes of `--prompt text` (one token each; nothing JSON escapes).
const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Token `position` of request `index` by its content word.
fn token(kind: PromptKind, request: &TraceRequest, index: usize, position: u64) -> u32 {
    let word = request.token_content(index, position);
    match kind {
        PromptKind::Tokens => TOKEN_BASE + (word % u64::from(TOKEN_SPAN)) as u32,
        PromptKind::Text => u32::from(ALPHABET[(word % ALPHABET.len() as u64) as usize]),
    }
}

/// The first `len` prompt tokens of request `index`: its session's context
/// first (see the module doc; empty outside session streams), then the
/// trace's tokens.
pub fn prompt_tokens(
    kind: PromptKind,
    request: &TraceRequest,
    index: usize,
    context: &[u32],
    len: u64,
) -> Vec<u32> {
    let context = match request.content {
        Content::Stream(_) => &context[..context.len().min(len as usize)],
        Content::Blocks(_) | Content::Unique => &[],
    };
    let mut tokens = Vec::with_capacity(len as usize);
    tokens.extend_from_slice(context);
    tokens.extend((context.len() as u64..len).map(|p| token(kind, request, index, p)));
    tokens
}

/// Output text as token ids of `kind`, for the next turn's context (the
/// router crate's text mapping in both kinds: essim serve's output is text).
pub fn output_ids(text: &str) -> Vec<u32> {
    engine_state_router::text_token_ids(text)
}

/// Tokens the chat template adds around one user message.
pub fn chat_overhead() -> u64 {
    engine_state_router::chat_prompt([("user", "")]).len() as u64
}

/// Prompt tokens to build for a request of `input_len`: the chat template's
/// tokens are taken off, so that the templated prompt has the trace's length.
pub fn content_len(endpoint: Endpoint, input_len: u64) -> u64 {
    match endpoint {
        Endpoint::Completions => input_len,
        Endpoint::Chat => input_len.saturating_sub(chat_overhead()).max(1),
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum PromptField {
    Tokens(Vec<u32>),
    Text(String),
}

#[derive(Serialize)]
struct ChatMessage {
    role: &'static str,
    content: String,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<PromptField>,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<[ChatMessage; 1]>,
    max_tokens: u64,
    /// vLLM's extra parameter: generate exactly `max_tokens`.
    ignore_eos: bool,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
}

fn text_of(tokens: &[u32]) -> String {
    let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The JSON body of one request.
pub fn body(
    endpoint: Endpoint,
    kind: PromptKind,
    model: &str,
    tokens: Vec<u32>,
    max_tokens: u64,
    session: Option<&str>,
) -> Vec<u8> {
    let (prompt, messages) = match (endpoint, kind) {
        (Endpoint::Completions, PromptKind::Tokens) => (Some(PromptField::Tokens(tokens)), None),
        (Endpoint::Completions, PromptKind::Text) => {
            (Some(PromptField::Text(text_of(&tokens))), None)
        }
        (Endpoint::Chat, _) => (
            None,
            Some([ChatMessage {
                role: "user",
                content: text_of(&tokens),
            }]),
        ),
    };
    let body = Body {
        model,
        prompt,
        messages,
        max_tokens,
        ignore_eos: true,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        user: session,
    };
    serde_json::to_vec(&body).expect("a body serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::output_tokens;
    use crate::{AgenticSpec, KV_BLOCK_TOKENS};

    fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    /// The engine's 16-token block hashes of a prompt (essim serve's).
    fn blocks(tokens: &[u32]) -> Vec<u64> {
        crate::serve::kv_block_hashes(tokens)
    }

    fn mooncake_like() -> Vec<TraceRequest> {
        let r = |ids: Vec<u64>, input_len| TraceRequest {
            arrival_ns: 0,
            input_len,
            output_len: 8,
            session: None,
            content: Content::Blocks(ids),
        };
        vec![
            r(vec![1, 2, 3], 1_300),
            r(vec![1, 2, 4], 1_400),
            r(vec![1, 2, 3, 5], 1_700),
            r(vec![9, 2, 3], 1_500),
            r(vec![1], 200),
            r(vec![1, 2], 700),
        ]
    }

    /// Every pair of prompts shares exactly the 16-token blocks the trace's
    /// own block hashes share, in both prompt kinds.
    #[test]
    fn prompts_share_blocks_exactly_where_the_trace_does() {
        let mut requests = mooncake_like();
        let agentic = AgenticSpec {
            sessions: 3,
            ..AgenticSpec::default()
        }
        .generate();
        requests.extend(agentic.requests.iter().take(8).cloned());
        for kind in [PromptKind::Tokens, PromptKind::Text] {
            let prompts: Vec<Vec<u32>> = requests
                .iter()
                .enumerate()
                .map(|(i, r)| prompt_tokens(kind, r, i, &[], r.input_len))
                .collect();
            for (i, a) in requests.iter().enumerate() {
                assert_eq!(prompts[i].len() as u64, a.input_len);
                let ta = &a.kv_block_hashes(i)[..(a.input_len / KV_BLOCK_TOKENS) as usize];
                for (j, b) in requests.iter().enumerate() {
                    let tb = &b.kv_block_hashes(j)[..(b.input_len / KV_BLOCK_TOKENS) as usize];
                    let trace_shared = common_prefix(ta, tb);
                    let prompt_shared = common_prefix(&blocks(&prompts[i]), &blocks(&prompts[j]));
                    assert_eq!(trace_shared, prompt_shared, "{kind:?} requests {i} and {j}");
                }
            }
            // Some pairs share, some do not: the check above is not vacuous.
            assert_eq!(
                common_prefix(&blocks(&prompts[0]), &blocks(&prompts[1])),
                64
            );
            assert_eq!(common_prefix(&blocks(&prompts[0]), &blocks(&prompts[3])), 0);
        }
    }

    /// A session's next prompt holds the previous prompt and its real
    /// output, then the trace's tokens; its length is the trace's.
    #[test]
    fn a_session_turn_carries_the_previous_output() {
        let trace = AgenticSpec {
            sessions: 1,
            turns_min: 3.0,
            ..AgenticSpec::default()
        }
        .generate();
        let turns = &trace.requests;
        assert!(turns.len() >= 2);
        let first = prompt_tokens(PromptKind::Tokens, &turns[0], 0, &[], turns[0].input_len);
        let output = output_tokens(7, turns[0].output_len);
        let mut context = first.clone();
        context.extend(&output);
        let second = prompt_tokens(
            PromptKind::Tokens,
            &turns[1],
            1,
            &context,
            turns[1].input_len,
        );
        assert_eq!(second.len() as u64, turns[1].input_len);
        assert_eq!(second[..context.len()], context[..]);
        // Past the context: the trace's stream tokens.
        let plain = prompt_tokens(PromptKind::Tokens, &turns[1], 1, &[], turns[1].input_len);
        assert_eq!(second[context.len()..], plain[context.len()..]);
        // Outside session streams a context is ignored.
        let blocks = &mooncake_like()[0];
        assert_eq!(
            prompt_tokens(PromptKind::Text, blocks, 0, &[1, 2, 3], 100),
            prompt_tokens(PromptKind::Text, blocks, 0, &[], 100)
        );
    }

    #[test]
    fn bodies_are_openai_requests() {
        let body = body(
            Endpoint::Completions,
            PromptKind::Tokens,
            "essim",
            vec![1001, 1002],
            5,
            Some("s3"),
        );
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"model": "essim", "prompt": [1001, 1002], "max_tokens": 5,
                "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
                "user": "s3"})
        );
        let text = prompt_tokens(PromptKind::Text, &mooncake_like()[0], 0, &[], 40);
        let chat = super::body(Endpoint::Chat, PromptKind::Text, "m", text, 5, None);
        let value: serde_json::Value = serde_json::from_slice(&chat).unwrap();
        let content = value["messages"][0]["content"].as_str().unwrap();
        assert_eq!(content.len(), 40);
        assert!(content.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert!(value.get("user").is_none() && value.get("prompt").is_none());
        let templated = engine_state_router::chat_prompt([("user", "x")]).len() as u64;
        assert_eq!(
            content_len(Endpoint::Chat, 1_000) + templated - 1,
            1_000,
            "the templated chat prompt has the trace's length"
        );
    }
}
