//! The short regexes of llama.cpp's pre-tokenizer sets, as plain scans over code points, and the
//! split loop that applies one of them to every segment (llama.cpp's `unicode_regex_split_stl`).
//!
//! llama.cpp runs these through `std::regex`: on a "collapsed" text (every non-ASCII code point
//! replaced by one byte standing for its category, non-ASCII whitespace by `\v`) when the regex
//! names a Unicode category, else through `std::wregex` on the code points with non-ASCII
//! whitespace replaced by `\v`. Either way a whitespace code point never belongs to any other
//! class, which the predicates here reproduce.

use crate::unicode::{self, WHITESPACE};

/// The text as code points with their class flags and byte offsets.
pub(super) struct Text {
    pub(super) cps: Vec<char>,
    pub(super) flags: Vec<u8>,
    /// `byte_at[i]` = byte offset of code point `i`; one extra entry for the end.
    pub(super) byte_at: Vec<usize>,
}

impl Text {
    pub(super) fn new(text: &str) -> Text {
        let mut cps = Vec::with_capacity(text.len());
        let mut flags = Vec::with_capacity(text.len());
        let mut byte_at = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cps.push(c);
            flags.push(unicode::flags(c));
            byte_at.push(i);
        }
        byte_at.push(text.len());
        Text {
            cps,
            flags,
            byte_at,
        }
    }
}

/// Applies one "regex": `find(text, pos, end)` returns the leftmost match `(start, end)` in
/// `pos..end`. Text between matches becomes its own segment, like llama.cpp's
/// `unicode_regex_split_stl`.
pub(super) fn split_by(
    text: &Text,
    segs: &[(usize, usize)],
    find: impl Fn(&Text, usize, usize) -> Option<(usize, usize)>,
) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(segs.len() * 2);
    for &(start, end) in segs {
        let mut pos = start;
        while pos < end {
            let Some((ms, me)) = find(text, pos, end) else {
                break;
            };
            if ms > pos {
                out.push((pos, ms));
            }
            out.push((ms, me));
            pos = me;
        }
        if pos < end {
            out.push((pos, end));
        }
    }
    out
}

/// Leftmost maximal run of characters satisfying `pred` (a `[class]+` regex).
pub(super) fn find_run(
    text: &Text,
    pos: usize,
    end: usize,
    pred: impl Fn(char, u8) -> bool,
) -> Option<(usize, usize)> {
    let start = (pos..end).find(|&i| pred(text.cps[i], text.flags[i]))?;
    let mut stop = start + 1;
    while stop < end && pred(text.cps[stop], text.flags[stop]) {
        stop += 1;
    }
    Some((start, stop))
}

/// `[0-9][0-9][0-9]`: the leftmost three consecutive ASCII digits.
pub(super) fn find_ascii_digit_triple(
    text: &Text,
    pos: usize,
    end: usize,
) -> Option<(usize, usize)> {
    let is_digit = |i: usize| text.cps[i].is_ascii_digit();
    (pos..end.saturating_sub(2))
        .find(|&i| is_digit(i) && is_digit(i + 1) && is_digit(i + 2))
        .map(|i| (i, i + 3))
}

/// `[class]`: the leftmost single character satisfying `pred`.
pub(super) fn find_one(
    text: &Text,
    pos: usize,
    end: usize,
    pred: impl Fn(char, u8) -> bool,
) -> Option<(usize, usize)> {
    (pos..end)
        .find(|&i| pred(text.cps[i], text.flags[i]))
        .map(|i| (i, i + 1))
}

/// `\s?[class]+`: at the leftmost position where either a whitespace character is followed by a
/// class character or a class character stands, the optional whitespace and the maximal run.
pub(super) fn find_ws_then_run(
    text: &Text,
    pos: usize,
    end: usize,
    pred: impl Fn(char, u8) -> bool,
) -> Option<(usize, usize)> {
    let is = |i: usize| pred(text.cps[i], text.flags[i]);
    let start = (pos..end)
        .find(|&i| is(i) || (text.flags[i] & WHITESPACE != 0 && i + 1 < end && is(i + 1)))?;
    let mut stop = start + 1;
    while stop < end && is(stop) {
        stop += 1;
    }
    Some((start, stop))
}

/// `\s+$`: the whitespace that ends the segment (`$` is the end of the segment, as for
/// `std::regex_iterator` over it).
pub(super) fn find_trailing_whitespace(
    text: &Text,
    pos: usize,
    end: usize,
) -> Option<(usize, usize)> {
    let mut start = end;
    while start > pos && text.flags[start - 1] & WHITESPACE != 0 {
        start -= 1;
    }
    (start < end).then_some((start, end))
}

/// `[^\n]+|[\n]+`: runs of newlines and runs of anything else (llama.cpp's
/// `unicode_regex_split_custom_newlines`).
pub(super) fn split_newlines(text: &Text, segs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(segs.len() * 2);
    for &(start, end) in segs {
        let mut pos = start;
        while pos < end {
            let newline = text.cps[pos] == '\n';
            let run = pos;
            while pos < end && (text.cps[pos] == '\n') == newline {
                pos += 1;
            }
            out.push((run, pos));
        }
    }
    out
}

fn in_table(table: &[(u32, u32)], c: char) -> bool {
    unicode::in_ranges(table, c as u32)
}

/// Whether `c` is in the explicit letter class of DeepSeek-LLM's tokenizer (`\s?[A-Za-zµÀ-Ö...]+`
/// in its `tokenizer.json`: the cased letters of the Unicode version it was written for). A
/// whitespace code point never is (llama.cpp's `std::wregex` sees it as `\v`).
pub(super) fn is_deepseek_letter(c: char, flags: u8) -> bool {
    flags & WHITESPACE == 0 && in_table(DEEPSEEK_LETTERS, c)
}

/// `[!-/:-~！-／：-～‘-‟　-。]`: DeepSeek-LLM's punctuation class (ASCII `:-~` includes the
/// letters, which an earlier split has already separated). U+3000 is whitespace, so it is not in.
pub(super) fn is_deepseek_punct(c: char, flags: u8) -> bool {
    const RANGES: &[(u32, u32)] = &[
        (0x21, 0x2F),
        (0x3A, 0x7E),
        (0x2018, 0x201F),
        (0x3000, 0x3002),
        (0xFF01, 0xFF0F),
        (0xFF1A, 0xFF5E),
    ];
    flags & WHITESPACE == 0 && in_table(RANGES, c)
}

/// `[一-龥ࠀ-一가-퟿]`, DeepSeek's "CJK" class: U+0800..=U+9FA5 (most non-Latin scripts, CJK
/// ideographs, many symbols) and U+AC00..=U+D7FF (Hangul), less whitespace.
pub(super) fn is_deepseek_cjk(c: char, flags: u8) -> bool {
    const RANGES: &[(u32, u32)] = &[(0x0800, 0x9FA5), (0xAC00, 0xD7FF)];
    flags & WHITESPACE == 0 && in_table(RANGES, c)
}

/// The class of [`is_deepseek_letter`], as sorted inclusive code point ranges.
#[rustfmt::skip]
const DEEPSEEK_LETTERS: &[(u32, u32)] = &[
    (0x0041, 0x005A), (0x0061, 0x007A), (0x00B5, 0x00B5), (0x00C0, 0x00D6), (0x00D8, 0x00F6),
    (0x00F8, 0x01BA), (0x01BC, 0x01BF), (0x01C4, 0x0293), (0x0295, 0x02AF), (0x0370, 0x0373),
    (0x0376, 0x0377), (0x037B, 0x037D), (0x037F, 0x037F), (0x0386, 0x0386), (0x0388, 0x038A),
    (0x038C, 0x038C), (0x038E, 0x03A1), (0x03A3, 0x03F5), (0x03F7, 0x0481), (0x048A, 0x052F),
    (0x0531, 0x0556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D), (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107),
    (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F),
    (0x2145, 0x2149), (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F),
    (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3),
    (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepseek_letter_table_is_sorted_and_disjoint() {
        for w in DEEPSEEK_LETTERS.windows(2) {
            assert!(w[0].0 <= w[0].1 && w[0].1 < w[1].0, "{w:?}");
        }
        let f = |c| unicode::flags(c);
        assert!(is_deepseek_letter('Ä', f('Ä')));
        assert!(is_deepseek_letter('н', f('н')));
        assert!(!is_deepseek_letter('我', f('我')));
        assert!(is_deepseek_cjk('我', f('我')));
        assert!(is_deepseek_cjk('ក', f('ក')));
        assert!(!is_deepseek_cjk('\u{3000}', f('\u{3000}')));
        assert!(is_deepseek_punct('～', f('～')));
        assert!(!is_deepseek_punct('\u{3000}', f('\u{3000}')));
    }
}
