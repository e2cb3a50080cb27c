//! Text prompts as token ids, for routers and fake engines that get text
//! instead of token ids: one owner, so that `esroute` and `essim serve`
//! (and any client that mimics them) hash the same prefix blocks from the
//! same text. The mapping is not a model's tokenizer: one token per UTF-8
//! byte (token id = the byte's value), so a 512-token router block is 512
//! bytes of the text. Chat messages are first laid out by one template.

/// A text prompt's token ids: one per UTF-8 byte.
pub fn text_token_ids(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// The chat template: `<|ROLE|>\nCONTENT\n` per message (role, content),
/// then `<|assistant|>\n` (the generation prompt).
pub fn chat_prompt<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut text = String::new();
    for (role, content) in messages {
        text.push_str("<|");
        text.push_str(role);
        text.push_str("|>\n");
        text.push_str(content);
        text.push('\n');
    }
    text.push_str("<|assistant|>\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_per_byte_and_one_template() {
        assert_eq!(text_token_ids("hé"), vec![104, 0xc3, 0xa9]);
        assert_eq!(
            chat_prompt([("system", "be brief"), ("user", "hi")]),
            "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
        );
    }
}
