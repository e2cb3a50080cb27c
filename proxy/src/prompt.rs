//! The prompt of a request body as token ids, for the router's block hashes.
//!
//! Token-id prompts (`"prompt": [1, 2, 3]`) are used as given. Text is mapped
//! by [`text_tokens`], the router crate's mapping (one token per UTF-8 byte;
//! `essim serve` uses the same, so the fake fleet's prefix cache and the
//! router's block hashes agree). It only has to be deterministic: equal
//! prefixes give equal block hashes; it is not a real engine's tokenizer (a
//! vLLM engine counts other tokens: send token ids to route by its cache).
//! Chat messages go through the router crate's template (`chat_prompt`;
//! content parts: their text ones, joined).

use serde_json::Value;

use crate::error::Error;

/// What the router needs from a request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutedPrompt {
    /// The prompt as token ids.
    pub tokens: Vec<u32>,
    /// The body's `session_id` field, if a string.
    pub session_id: Option<String>,
}

/// The text → token-id mapping (the module docs say how).
pub use engine_state_router::text_token_ids as text_tokens;

/// Reads the prompt of a `/v1/completions` (`chat: false`: field `prompt`)
/// or `/v1/chat/completions` (`chat: true`: field `messages`) body.
pub fn prompt_tokens(body: &Value, chat: bool) -> Result<RoutedPrompt, Error> {
    let bad = |what: &str| Error::BadRequest(what.to_owned());
    let object = body
        .as_object()
        .ok_or_else(|| bad("the request body must be a JSON object"))?;
    let tokens = if chat {
        let messages = object
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("the body needs \"messages\": a list of {role, content}"))?;
        let mut contents: Vec<(String, String)> = Vec::with_capacity(messages.len());
        for message in messages {
            let role = message.get("role").and_then(Value::as_str).unwrap_or("");
            let content = match message.get("content") {
                Some(Value::String(content)) => content.clone(),
                // Content parts: the text ones, in order.
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|part| part.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => String::new(),
            };
            contents.push((role.to_owned(), content));
        }
        let text = engine_state_router::chat_prompt(
            contents
                .iter()
                .map(|(role, content)| (role.as_str(), content.as_str())),
        );
        text_tokens(&text)
    } else {
        match object.get("prompt") {
            Some(Value::String(text)) => text_tokens(text),
            Some(Value::Array(items)) if items.iter().all(Value::is_u64) => items
                .iter()
                .map(|item| {
                    item.as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .ok_or_else(|| bad("a token id in \"prompt\" is over 2^32 - 1"))
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Array(_)) => {
                return Err(bad(
                    "\"prompt\" must be a string or a list of token ids; batched prompts \
                     are not routed: send one prompt per request",
                ))
            }
            _ => {
                return Err(bad(
                    "the body needs \"prompt\": a string or a list of token ids",
                ))
            }
        }
    };
    let session_id = object
        .get("session_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(RoutedPrompt { tokens, session_id })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn token_ids_text_and_chat() {
        let ids = prompt_tokens(&json!({"prompt": [5, 6, 7], "session_id": "s1"}), false).unwrap();
        assert_eq!(ids.tokens, vec![5, 6, 7]);
        assert_eq!(ids.session_id.as_deref(), Some("s1"));
        let text = prompt_tokens(&json!({"prompt": "a b a"}), false).unwrap();
        assert_eq!(text.tokens, vec![97, 32, 98, 32, 97], "one per byte");
        let chat = prompt_tokens(
            &json!({"messages": [{"role": "user", "content": "hi there"}]}),
            true,
        )
        .unwrap();
        assert_eq!(
            chat.tokens,
            text_tokens("<|user|>\nhi there\n<|assistant|>\n"),
            "the router crate's template, as essim serve lays it out"
        );
    }

    #[test]
    fn bad_prompts_say_what_is_expected() {
        for body in [
            json!([1, 2]),
            json!({"prompt": [[1, 2]]}),
            json!({"prompt": [1, -2]}),
            json!({"prompt": [5_000_000_000u64]}),
            json!({}),
        ] {
            let error = prompt_tokens(&body, false).unwrap_err();
            assert!(matches!(error, Error::BadRequest(_)), "{body}");
        }
        assert!(prompt_tokens(&json!({"prompt": "x"}), true).is_err());
    }
}
