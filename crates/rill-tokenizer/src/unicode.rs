//! Character classes used by the pre-tokenizers, and GPT-2's byte-to-unicode mapping.
//!
//! llama.cpp classifies code points with its own generated tables (`unicode-data.cpp`): a general
//! category (`\p{L}`, `\p{N}`, `\p{P}`, ...) plus the Unicode `White_Space` property. We take the
//! general categories from `regex-syntax`'s Unicode tables and `White_Space` from
//! [`char::is_whitespace`], which is defined as exactly that property.

use std::sync::OnceLock;

/// Set for every in-range position, so "no flags at all" means "outside the current segment"
/// (llama.cpp's `flags.as_uint() == 0`).
pub(crate) const DEFINED: u8 = 0x01;
/// `\p{L}`.
pub(crate) const LETTER: u8 = 0x02;
/// `\p{N}`.
pub(crate) const NUMBER: u8 = 0x04;
/// `\p{P}`.
pub(crate) const PUNCT: u8 = 0x08;
/// Unicode `White_Space` (what llama.cpp and `\s` call whitespace).
pub(crate) const WHITESPACE: u8 = 0x10;
/// `\p{M}` (combining marks).
pub(crate) const MARK: u8 = 0x20;
/// `\p{S}` (symbols).
pub(crate) const SYMBOL: u8 = 0x40;
/// `\p{C}` (control, format, private use, surrogates, unassigned).
pub(crate) const CONTROL: u8 = 0x80;

struct Tables {
    letter: Vec<(u32, u32)>,
    number: Vec<(u32, u32)>,
    punct: Vec<(u32, u32)>,
    mark: Vec<(u32, u32)>,
    symbol: Vec<(u32, u32)>,
    control: Vec<(u32, u32)>,
    ascii: [u8; 128],
}

pub(crate) fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    // The patterns are compile-time constants known to parse into a Unicode class; an empty table
    // would only make every character "other", never a panic.
    let Ok(hir) = regex_syntax::Parser::new().parse(pattern) else {
        return Vec::new();
    };
    match hir.kind() {
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        _ => Vec::new(),
    }
}

pub(crate) fn in_ranges(ranges: &[(u32, u32)], cp: u32) -> bool {
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut t = Tables {
            letter: class_ranges(r"\p{L}"),
            number: class_ranges(r"\p{N}"),
            punct: class_ranges(r"\p{P}"),
            mark: class_ranges(r"\p{M}"),
            symbol: class_ranges(r"\p{S}"),
            control: class_ranges(r"\p{C}"),
            ascii: [0; 128],
        };
        for b in 0u8..128 {
            t.ascii[b as usize] = slow_flags(&t, b as char);
        }
        t
    })
}

fn slow_flags(t: &Tables, c: char) -> u8 {
    let cp = c as u32;
    let mut f = DEFINED;
    if in_ranges(&t.letter, cp) {
        f |= LETTER;
    }
    if in_ranges(&t.number, cp) {
        f |= NUMBER;
    }
    if in_ranges(&t.punct, cp) {
        f |= PUNCT;
    }
    if in_ranges(&t.mark, cp) {
        f |= MARK;
    }
    if in_ranges(&t.symbol, cp) {
        f |= SYMBOL;
    }
    if in_ranges(&t.control, cp) {
        f |= CONTROL;
    }
    if c.is_whitespace() {
        f |= WHITESPACE;
    }
    f
}

/// The class flags of one character (always includes [`DEFINED`]).
pub(crate) fn flags(c: char) -> u8 {
    let t = tables();
    if c.is_ascii() {
        t.ascii[c as usize]
    } else {
        slow_flags(t, c)
    }
}

/// GPT-2's reversible byte -> printable character mapping: printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100.. in byte order.
pub(crate) fn byte_to_char_table() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..256u32 {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            let cp = if printable {
                b
            } else {
                next += 1;
                next - 1
            };
            table[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        table
    })
}

/// Inverse of [`byte_to_char_table`]: the byte a GPT-2 byte-level character stands for.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<[i16; 324]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut inv = [-1i16; 324];
        for (b, &c) in byte_to_char_table().iter().enumerate() {
            inv[c as usize] = b as i16;
        }
        inv
    });
    let i = c as usize;
    if i < table.len() && table[i] >= 0 {
        Some(table[i] as u8)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    /// The tables come from patterns parsed at run time; an empty one would silently make every
    /// such character "other".
    #[test]
    fn class_tables_are_populated() {
        for pattern in [r"\p{L}", r"\p{N}", r"\p{P}", r"\p{M}"] {
            assert!(super::class_ranges(pattern).len() > 10, "{pattern}");
        }
    }

    use super::*;

    #[test]
    fn classes() {
        assert_eq!(flags('a') & LETTER, LETTER);
        assert_eq!(flags('é') & LETTER, LETTER);
        assert_eq!(flags('東') & LETTER, LETTER);
        assert_eq!(flags('7') & NUMBER, NUMBER);
        assert_eq!(flags('½') & NUMBER, NUMBER);
        assert_eq!(flags(',') & PUNCT, PUNCT);
        assert_eq!(flags('\u{301}') & (MARK | LETTER), MARK);
        assert_eq!(flags('\u{17b6}') & MARK, MARK);
        assert_eq!(flags('$') & PUNCT, 0);
        assert_eq!(flags('\u{a0}') & WHITESPACE, WHITESPACE);
        assert_eq!(flags('\u{3000}') & WHITESPACE, WHITESPACE);
        assert_eq!(flags('\u{200d}') & (LETTER | NUMBER | WHITESPACE), 0);
        assert_eq!(flags('x'), DEFINED | LETTER);
    }

    #[test]
    fn gpt2_byte_map_roundtrip() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'A' as usize], 'A');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('€'), None);
    }
}
