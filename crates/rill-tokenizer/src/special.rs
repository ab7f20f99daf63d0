//! Special-token partitioning (llama.cpp `tokenizer_st_partition`).
//!
//! llama.cpp walks its special tokens longest first and, for each one, cuts every occurrence out
//! of the still-unprocessed text fragments. That order matters (a longer token wins over a shorter
//! one that overlaps it), so it is reproduced exactly. To keep this fast with vocabularies that
//! have thousands of special tokens (Gemma: ~6400), a byte trie first finds which special tokens
//! occur in the text at all; only those take part in the partition.

use crate::attr;

/// A piece of the partitioned input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    /// A special token found in the text.
    Token(u32),
    /// Ordinary text; `after_special` is true at the very start and right after a special token
    /// (where SPM adds its space prefix).
    Text { text: &'t str, after_special: bool },
}

#[derive(Debug, Default)]
struct Node {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    token: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    nodes: Vec<Node>,
    /// Rank of each special token in llama.cpp's processing order (longest text first; ties by
    /// id, where llama.cpp's unstable sort leaves the order unspecified).
    order: std::collections::HashMap<u32, u32>,
}

impl SpecialMatcher {
    /// Indexes every control, user-defined and unknown token.
    pub(crate) fn new(tokens: &[std::sync::Arc<str>], attrs: &[u8]) -> SpecialMatcher {
        let mut ids: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        ids.sort_by(|&a, &b| {
            tokens[b as usize]
                .len()
                .cmp(&tokens[a as usize].len())
                .then(a.cmp(&b))
        });
        let mut nodes = vec![Node::default()];
        for &id in &ids {
            let mut cur = 0usize;
            for &byte in tokens[id as usize].as_bytes() {
                cur = match nodes[cur].children.binary_search_by_key(&byte, |&(b, _)| b) {
                    Ok(k) => nodes[cur].children[k].1 as usize,
                    Err(k) => {
                        let new = nodes.len();
                        nodes.push(Node::default());
                        nodes[cur].children.insert(k, (byte, new as u32));
                        new
                    }
                };
            }
            nodes[cur].token = Some(id);
        }
        let order = ids
            .iter()
            .enumerate()
            .map(|(rank, &id)| (id, rank as u32))
            .collect();
        SpecialMatcher { nodes, order }
    }

    /// Special tokens occurring anywhere in `text`, in processing order.
    fn candidates(&self, text: &str, parse_special: bool, attrs: &[u8]) -> Vec<u32> {
        let bytes = text.as_bytes();
        let mut found = Vec::new();
        for start in 0..bytes.len() {
            let mut cur = 0usize;
            for &byte in &bytes[start..] {
                match self.nodes[cur]
                    .children
                    .binary_search_by_key(&byte, |&(b, _)| b)
                {
                    Ok(k) => cur = self.nodes[cur].children[k].1 as usize,
                    Err(_) => break,
                }
                if let Some(id) = self.nodes[cur].token {
                    found.push(id);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        // Without parse_special only user-defined tokens are matched (llama.cpp skips tokens with
        // the control or unknown attribute, even if they are also user-defined).
        if !parse_special {
            found.retain(|&id| attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) == 0);
        }
        found.sort_by_key(|id| self.order.get(id).copied().unwrap_or(u32::MAX));
        found
    }

    /// Splits `text` into special tokens and the text between them.
    pub(crate) fn partition<'t>(
        &self,
        text: &'t str,
        parse_special: bool,
        attrs: &[u8],
        tokens: &[std::sync::Arc<str>],
    ) -> Vec<Fragment<'t>> {
        enum Part {
            Raw(usize, usize),
            Tok(u32),
        }
        if text.is_empty() {
            return Vec::new();
        }
        let mut parts = vec![Part::Raw(0, text.len())];
        for id in self.candidates(text, parse_special, attrs) {
            let needle = &*tokens[id as usize];
            let mut next = Vec::with_capacity(parts.len() + 2);
            for part in parts {
                let Part::Raw(mut start, end) = part else {
                    next.push(part);
                    continue;
                };
                while let Some(rel) = text[start..end].find(needle) {
                    let at = start + rel;
                    if at > start {
                        next.push(Part::Raw(start, at));
                    }
                    next.push(Part::Tok(id));
                    start = at + needle.len();
                }
                if start < end {
                    next.push(Part::Raw(start, end));
                }
            }
            parts = next;
        }
        let mut out = Vec::with_capacity(parts.len());
        let mut after_special = true;
        for part in parts {
            match part {
                Part::Tok(id) => {
                    out.push(Fragment::Token(id));
                    after_special = true;
                }
                Part::Raw(s, e) => {
                    out.push(Fragment::Text {
                        text: &text[s..e],
                        after_special,
                    });
                    after_special = false;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (Vec<std::sync::Arc<str>>, Vec<u8>) {
        let tokens: Vec<std::sync::Arc<str>> = ["a", "<s>", "<ctl>", "<ctl>x", "\n"]
            .iter()
            .map(|s| std::sync::Arc::from(*s))
            .collect();
        let attrs = vec![
            attr::NORMAL,
            attr::USER_DEFINED,
            attr::CONTROL,
            attr::CONTROL,
            attr::USER_DEFINED,
        ];
        (tokens, attrs)
    }

    #[test]
    fn partitions_longest_first() {
        let (tokens, attrs) = setup();
        let m = SpecialMatcher::new(&tokens, &attrs);
        let parts = m.partition("q<ctl>x<s>\nz<ctl>", true, &attrs, &tokens);
        assert_eq!(
            parts,
            vec![
                Fragment::Text {
                    text: "q",
                    after_special: true
                },
                Fragment::Token(3),
                Fragment::Token(1),
                Fragment::Token(4),
                Fragment::Text {
                    text: "z",
                    after_special: true
                },
                Fragment::Token(2),
            ]
        );
    }

    #[test]
    fn control_tokens_need_parse_special() {
        let (tokens, attrs) = setup();
        let m = SpecialMatcher::new(&tokens, &attrs);
        let parts = m.partition("<ctl><s>", false, &attrs, &tokens);
        assert_eq!(
            parts,
            vec![
                Fragment::Text {
                    text: "<ctl>",
                    after_special: true
                },
                Fragment::Token(1),
            ]
        );
        assert!(m.partition("", true, &attrs, &tokens).is_empty());
    }
}
