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

/// A prompt: its token ids and, ready for the body, their JSON (the ids
/// joined by commas, or the text's escaped characters), so that a session's
/// next prompt copies its context's JSON instead of serialising it again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prompt {
    /// The token ids.
    pub tokens: Vec<u32>,
    json: Vec<u8>,
}

impl Prompt {
    /// A prompt of these tokens.
    pub fn of(kind: PromptKind, tokens: Vec<u32>) -> Prompt {
        let mut prompt = Prompt::default();
        match kind {
            PromptKind::Tokens => {
                for &t in &tokens {
                    prompt.push_id(t);
                }
            }
            PromptKind::Text => {
                let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
                prompt.push_text(&String::from_utf8_lossy(&bytes));
            }
        }
        prompt.tokens = tokens;
        prompt
    }

    fn push_id(&mut self, id: u32) {
        if !self.json.is_empty() {
            self.json.push(b',');
        }
        self.json
            .extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
    }

    /// Text's JSON-escaped characters (its tokens are not touched).
    fn push_text(&mut self, text: &str) {
        let quoted = serde_json::to_vec(text).expect("a string serialises");
        self.json.extend_from_slice(&quoted[1..quoted.len() - 1]);
    }

    /// Append one token of `kind` (a filler token: an id, or a byte that
    /// needs no escaping).
    fn push(&mut self, kind: PromptKind, token: u32) {
        self.tokens.push(token);
        match kind {
            PromptKind::Tokens => self.push_id(token),
            PromptKind::Text => self.json.push(token as u8),
        }
    }

    /// This prompt followed by the text a server generated for it: the
    /// next turn's context. The output's token ids are the router crate's
    /// text mapping in both kinds (the response is text; with essim serve,
    /// whose tokens are bytes, they are the ids it generated).
    pub fn with_output(mut self, kind: PromptKind, text: &str) -> Prompt {
        let ids = engine_state_router::text_token_ids(text);
        match kind {
            PromptKind::Tokens => {
                for &t in &ids {
                    self.push_id(t);
                }
            }
            PromptKind::Text => self.push_text(text),
        }
        self.tokens.extend(ids);
        self
    }
}

/// The prompt of `len` tokens of request `index`: its session's context
/// first (see the module doc; ignored outside session streams), then the
/// trace's tokens.
pub fn prompt(
    kind: PromptKind,
    request: &TraceRequest,
    index: usize,
    context: Prompt,
    len: u64,
) -> Prompt {
    let mut prompt = match request.content {
        Content::Stream(_) if context.tokens.len() as u64 > len => {
            Prompt::of(kind, context.tokens[..len as usize].to_vec())
        }
        Content::Stream(_) => context,
        Content::Blocks(_) | Content::Unique => Prompt::default(),
    };
    prompt.tokens.reserve(len as usize - prompt.tokens.len());
    for p in prompt.tokens.len() as u64..len {
        prompt.push(kind, token(kind, request, index, p));
    }
    prompt
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
struct StreamOptions {
    include_usage: bool,
}

/// The body's fields after the prompt.
#[derive(Serialize)]
struct Rest<'a> {
    model: &'a str,
    max_tokens: u64,
    /// vLLM's extra parameter: generate exactly `max_tokens`.
    ignore_eos: bool,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
}

/// The JSON body of one request: the prompt's JSON copied in, then the
/// other fields.
pub fn body(
    endpoint: Endpoint,
    kind: PromptKind,
    model: &str,
    prompt: &Prompt,
    max_tokens: u64,
    session: Option<&str>,
) -> Vec<u8> {
    let rest = serde_json::to_vec(&Rest {
        model,
        max_tokens,
        ignore_eos: true,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        user: session,
    })
    .expect("a body serialises");
    let (open, close): (&[u8], &[u8]) = match (endpoint, kind) {
        (Endpoint::Completions, PromptKind::Tokens) => (b"{\"prompt\":[", b"],"),
        (Endpoint::Completions, PromptKind::Text) => (b"{\"prompt\":\"", b"\","),
        (Endpoint::Chat, _) => (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"",
            b"\"}],",
        ),
    };
    let mut body = Vec::with_capacity(open.len() + prompt.json.len() + close.len() + rest.len());
    body.extend_from_slice(open);
    body.extend_from_slice(&prompt.json);
    body.extend_from_slice(close);
    // `rest` without its opening brace.
    body.extend_from_slice(&rest[1..]);
    body
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
                .map(|(i, r)| prompt(kind, r, i, Prompt::default(), r.input_len).tokens)
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
        let kind = PromptKind::Tokens;
        let first = prompt(kind, &turns[0], 0, Prompt::default(), turns[0].input_len);
        let output: String = output_tokens(7, turns[0].output_len)
            .iter()
            .map(|&t| char::from(t as u8))
            .collect();
        let context = first.clone().with_output(kind, &output);
        assert_eq!(context.tokens[..first.tokens.len()], first.tokens[..]);
        assert_eq!(
            context.tokens[first.tokens.len()..],
            engine_state_router::text_token_ids(&output)[..]
        );
        let second = prompt(kind, &turns[1], 1, context.clone(), turns[1].input_len);
        assert_eq!(second.tokens.len() as u64, turns[1].input_len);
        assert_eq!(second.tokens[..context.tokens.len()], context.tokens[..]);
        // Past the context: the trace's stream tokens.
        let plain = prompt(kind, &turns[1], 1, Prompt::default(), turns[1].input_len);
        assert_eq!(
            second.tokens[context.tokens.len()..],
            plain.tokens[context.tokens.len()..]
        );
        // A context longer than the prompt is cut.
        let short = prompt(kind, &turns[1], 1, context.clone(), 10);
        assert_eq!(short.tokens, context.tokens[..10]);
        assert_eq!(short, Prompt::of(kind, context.tokens[..10].to_vec()));
        // Outside session streams a context is ignored.
        let blocks = &mooncake_like()[0];
        assert_eq!(
            prompt(PromptKind::Text, blocks, 0, context, 100),
            prompt(PromptKind::Text, blocks, 0, Prompt::default(), 100)
        );
    }

    /// The JSON built piece by piece (a context's copied in, an output
    /// escaped) is the JSON of the tokens.
    #[test]
    fn prompt_json_is_built_incrementally_and_escaped() {
        let request = &mooncake_like()[0];
        let stream = TraceRequest {
            content: Content::Stream(5),
            ..request.clone()
        };
        for kind in [PromptKind::Tokens, PromptKind::Text] {
            let first = prompt(kind, &stream, 0, Prompt::default(), 50);
            let context = first.with_output(kind, "a\"b\\c\n é");
            let next = prompt(kind, &stream, 1, context, 120);
            let body = body(Endpoint::Completions, kind, "m", &next, 3, None);
            let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let sent: Vec<u32> = match kind {
                PromptKind::Tokens => value["prompt"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect(),
                PromptKind::Text => {
                    engine_state_router::text_token_ids(value["prompt"].as_str().unwrap())
                }
            };
            assert_eq!(sent, next.tokens, "{kind:?}");
            assert_eq!(next.tokens.len(), 120);
            assert_eq!(Prompt::of(kind, next.tokens.clone()), next, "{kind:?}");
        }
    }

    #[test]
    fn bodies_are_openai_requests() {
        let body = body(
            Endpoint::Completions,
            PromptKind::Tokens,
            "essim",
            &Prompt::of(PromptKind::Tokens, vec![1001, 1002]),
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
        let text = prompt(
            PromptKind::Text,
            &mooncake_like()[0],
            0,
            Prompt::default(),
            40,
        );
        let chat = super::body(Endpoint::Chat, PromptKind::Text, "m", &text, 5, None);
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
