//! The hand-written splitters for the two big regexes, reproducing llama.cpp's
//! `unicode_regex_split_custom_gpt2` / `_llama3` / `_qwen2` / `_qwen35` state machines step by step,
//! including their exact treatment of segment boundaries, so that the splits are identical, not
//! merely regex-equivalent.

use super::scan::Text;
use crate::unicode::{DEFINED, LETTER, NUMBER, WHITESPACE};

/// Shared state of the hand-written splitters for one segment `[ini, end)`.
struct Seg<'a> {
    text: &'a Text,
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<(usize, usize)>,
}

impl Seg<'_> {
    /// Code point at `pos`, or `None` outside the segment (llama.cpp's `OUT_OF_RANGE`).
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.text.cps[pos])
    }

    /// Flags at `pos`, or 0 outside the segment.
    fn flags(&self, pos: usize) -> u8 {
        if self.ini <= pos && pos < self.end {
            self.text.flags[pos]
        } else {
            0
        }
    }

    /// Closes the current word at `end`; returns its length in code points.
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push((self.prev_end, end));
        }
        self.prev_end = end;
        len
    }
}

fn is_contraction_1(c: char) -> bool {
    matches!(c, 's' | 't' | 'm' | 'd')
}

fn is_contraction_2(a: char, b: char) -> bool {
    matches!((a, b), ('r', 'e') | ('v', 'e') | ('l', 'l'))
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
pub(super) fn split_gpt2(text: &Text, segs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(segs.len() * 2);
    for &(ini, end) in segs {
        let mut s = Seg {
            text,
            ini,
            end,
            prev_end: ini,
            out: &mut out,
        };
        let mut pos = ini;
        while pos < end {
            let cpt = text.cps[pos];
            let flags = text.flags[pos];

            if cpt == '\'' && pos + 1 < end {
                let next = text.cps[pos + 1];
                if is_contraction_1(next) {
                    pos += s.add(pos + 2);
                    continue;
                }
                if pos + 2 < end && is_contraction_2(next, text.cps[pos + 2]) {
                    pos += s.add(pos + 3);
                    continue;
                }
            }

            let space = usize::from(cpt == ' ');
            let mut flags2 = if cpt == ' ' { s.flags(pos + 1) } else { flags };
            if flags2 & LETTER != 0 {
                pos += space;
                while flags2 & LETTER != 0 {
                    pos += 1;
                    flags2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }
            if flags2 & NUMBER != 0 {
                pos += space;
                while flags2 & NUMBER != 0 {
                    pos += 1;
                    flags2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }
            if flags2 & (WHITESPACE | LETTER | NUMBER) == 0 && flags2 & DEFINED != 0 {
                pos += space;
                while flags2 & (WHITESPACE | LETTER | NUMBER) == 0 && flags2 & DEFINED != 0 {
                    pos += 1;
                    flags2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }

            let mut n_ws = 0;
            while s.flags(pos + n_ws) & WHITESPACE != 0 {
                n_ws += 1;
            }
            // \s+(?!\S): leave the last whitespace to prefix the next word.
            if n_ws > 1 && s.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                s.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                s.add(pos);
                continue;
            }
            pos += 1;
            s.add(pos);
        }
    }
    out
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
///
/// With `max_digits == 3` and `letters == LETTER` this is llama.cpp's custom Llama-3 splitter;
/// with 1 it is its Qwen2 splitter. `letters == LETTER | MARK` gives the Qwen3.5 regex, where
/// `[\p{L}\p{M}]` takes the place of `\p{L}` in the letter run and in the excluded class of the
/// punctuation run.
pub(super) fn split_llama3(
    text: &Text,
    segs: &[(usize, usize)],
    max_digits: usize,
    letters: u8,
) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(segs.len() * 2);
    for &(ini, end) in segs {
        let mut s = Seg {
            text,
            ini,
            end,
            prev_end: ini,
            out: &mut out,
        };
        let mut pos = ini;
        while pos < end {
            let cpt = text.cps[pos];
            let flags = text.flags[pos];

            if cpt == '\'' && pos + 1 < end {
                let next = text.cps[pos + 1].to_ascii_lowercase();
                if is_contraction_1(next) {
                    pos += s.add(pos + 2);
                    continue;
                }
                if pos + 2 < end && is_contraction_2(next, text.cps[pos + 2].to_ascii_lowercase()) {
                    pos += s.add(pos + 3);
                    continue;
                }
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(cpt == '\r' || cpt == '\n' || flags & NUMBER != 0)
                && (flags & letters != 0 || s.flags(pos + 1) & letters != 0)
            {
                pos += 1;
                while s.flags(pos) & letters != 0 {
                    pos += 1;
                }
                s.add(pos);
                continue;
            }

            // \p{N}{1,max_digits}
            if flags & NUMBER != 0 {
                let mut group_start = pos;
                while s.flags(pos) & NUMBER != 0 {
                    pos += 1;
                    if pos - group_start >= max_digits {
                        s.add(pos);
                        group_start = pos;
                    }
                }
                s.add(pos);
                continue;
            }

            // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (llama.cpp tests the *current* flags for being defined,
            // which only matters past the segment end)
            let space = usize::from(cpt == ' ');
            let mut flags2 = if cpt == ' ' { s.flags(pos + 1) } else { flags };
            if flags2 & (WHITESPACE | letters | NUMBER) == 0 && flags & DEFINED != 0 {
                pos += space;
                while flags2 & (WHITESPACE | letters | NUMBER) == 0 && flags2 & DEFINED != 0 {
                    pos += 1;
                    flags2 = s.flags(pos);
                }
                while matches!(s.cpt(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                s.add(pos);
                continue;
            }

            let mut n_ws = 0;
            let mut last_end_r_or_n = 0;
            while s.flags(pos + n_ws) & WHITESPACE != 0 {
                if matches!(text.cps[pos + n_ws], '\r' | '\n') {
                    last_end_r_or_n = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            // \s*[\r\n]+
            if last_end_r_or_n > 0 {
                pos = last_end_r_or_n;
                s.add(pos);
                continue;
            }
            // \s+(?!\S)
            if n_ws > 1 && s.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                s.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                s.add(pos);
                continue;
            }
            pos += 1;
            s.add(pos);
        }
    }
    out
}
