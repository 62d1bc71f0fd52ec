//! A cheap deterministic tokenizer and vLLM-style chained block ids.
//!
//! The sim needs token counts and cache blocks that behave like a real model server's, not a real
//! vocabulary. A token is a short run of whitespace plus one word piece (up to
//! [`MAX_WORD_CHARS`] alphanumerics) or one other character, about one token per English word.
//! Token boundaries depend only on the text before them, so two prompts that share leading text
//! share leading tokens. A block id hashes the previous block id with the block's text, so an id
//! names a whole prefix: the same text at another position is another block.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Longest alphanumeric run kept in one token; longer words split.
pub const MAX_WORD_CHARS: usize = 8;
/// Longest whitespace run glued to the front of a token; longer runs become their own tokens.
pub const MAX_SPACE_CHARS: usize = 4;
/// Seed for the first block of every prompt.
const ROOT_BLOCK_SEED: u64 = 0x5EED_B10C_0000_0001;

/// End byte offset of the token starting at byte `start` of `text` (`start < text.len()`).
fn token_end(text: &str, start: usize) -> usize {
    let mut chars = text[start..].char_indices().peekable();
    let mut spaces = 0;
    while let Some(&(_, c)) = chars.peek() {
        if !c.is_whitespace() || spaces == MAX_SPACE_CHARS {
            break;
        }
        chars.next();
        spaces += 1;
    }
    let Some(&(at, first)) = chars.peek() else {
        return text.len();
    };
    if first.is_whitespace() {
        return start + at;
    }
    if !first.is_alphanumeric() {
        return start + at + first.len_utf8();
    }
    let mut end = start + at;
    for (at, c) in chars.take(MAX_WORD_CHARS) {
        if !c.is_alphanumeric() {
            break;
        }
        end = start + at + c.len_utf8();
    }
    end
}

/// End byte offsets of every token of `text`, in order.
pub fn token_ends(text: &str) -> Vec<usize> {
    let mut ends = Vec::with_capacity(text.len() / 4 + 1);
    let mut at = 0;
    while at < text.len() {
        at = token_end(text, at);
        ends.push(at);
    }
    ends
}

/// Number of tokens in `text`.
pub fn count_tokens(text: &str) -> usize {
    token_ends(text).len()
}

/// A tokenized prompt: its token count and the chained ids of its full blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocks {
    /// Tokens in the prompt, including the partial last block.
    pub tokens: usize,
    /// One id per full block of `block_tokens` tokens, in prompt order.
    pub ids: Vec<u64>,
}

/// Tokenize `text` and name each full block of `block_tokens` tokens (must be at least 1).
pub fn blocks(text: &str, block_tokens: usize) -> Blocks {
    let ends = token_ends(text);
    let mut ids = Vec::with_capacity(ends.len() / block_tokens.max(1));
    let mut prev = ROOT_BLOCK_SEED;
    let mut start = 0;
    for chunk in ends.chunks_exact(block_tokens.max(1)) {
        let end = chunk[chunk.len() - 1];
        prev = xxh3_64_with_seed(&text.as_bytes()[start..end], prev);
        ids.push(prev);
        start = end;
    }
    Blocks {
        tokens: ends.len(),
        ids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        let mut start = 0;
        token_ends(text)
            .into_iter()
            .map(|end| {
                let piece = &text[start..end];
                start = end;
                piece
            })
            .collect()
    }

    #[test]
    fn words_carry_their_leading_space() {
        assert_eq!(
            pieces("Hello, world! 42"),
            ["Hello", ",", " world", "!", " 42"]
        );
    }

    #[test]
    fn long_words_and_long_spaces_split() {
        assert_eq!(pieces("abcdefghijk"), ["abcdefgh", "ijk"]);
        assert_eq!(pieces("a      b"), ["a", "    ", "  b"]);
        assert_eq!(pieces("end  "), ["end", "  "]);
        assert_eq!(pieces("héllo wörld"), ["héllo", " wörld"]);
        assert_eq!(count_tokens(""), 0);
    }

    #[test]
    fn only_full_blocks_get_ids() {
        let b = blocks("one two three four five six seven", 3);
        assert_eq!(b.tokens, 7);
        assert_eq!(b.ids.len(), 2);
    }

    #[test]
    fn shared_leading_text_shares_leading_blocks() {
        let a = blocks("alpha beta gamma delta epsilon zeta", 2);
        let b = blocks("alpha beta gamma delta omega psi", 2);
        assert_eq!(a.ids[..2], b.ids[..2]);
        assert_ne!(a.ids[2], b.ids[2]);
    }

    #[test]
    fn same_text_at_another_position_is_another_block() {
        // Blocks 0 and 1 hold the same text, but block 1's id also names block 0 before it.
        let b = blocks(" x y x y", 2);
        assert_eq!(b.ids.len(), 2);
        assert_ne!(b.ids[0], b.ids[1]);
        let shifted = blocks(" z w x y", 2);
        assert_ne!(shifted.ids[1], b.ids[0]);
    }
}
