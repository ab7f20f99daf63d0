//! `rill tokenize`: ids and pieces of a text, with no BOS/EOS added.

use anyhow::{Context, Result};

use super::{ModelArgs, TextInput};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Match control tokens written in the text (e.g. <|im_start|>) as single tokens.
    #[arg(long)]
    pub parse_special: bool,
    /// Print only {"ids": [...]} on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: TextInput,
}

pub fn main(args: Args) -> Result<()> {
    let text = args.input.read()?;
    let path = args.model.path()?;
    // Only the tokenizer is needed: no weights are touched.
    let file = rill_gguf::GgufFile::open(&path)?;
    let tokenizer = rill_tokenizer::Tokenizer::from_gguf(file.metadata())
        .with_context(|| format!("cannot build the tokenizer of {}", path.display()))?;
    let ids = tokenizer.encode(&text, args.parse_special);
    if args.json {
        println!("{}", serde_json::json!({ "ids": ids }));
        return Ok(());
    }
    for &id in &ids {
        let piece = match tokenizer.token_to_bytes(id, true) {
            Ok(bytes) => piece_text(&bytes),
            Err(_) => "?".into(),
        };
        println!("{id:>8}  {piece}");
    }
    eprintln!("{} tokens", ids.len());
    Ok(())
}

/// A token's bytes quoted: its UTF-8 text escaped as Rust writes it, and every byte that is
/// not part of a whole character (a piece of an emoji split over tokens) as `<0xF0>`.
fn piece_text(bytes: &[u8]) -> String {
    let mut out = String::from("\"");
    for chunk in bytes.utf8_chunks() {
        out.extend(chunk.valid().chars().flat_map(char::escape_debug));
        for b in chunk.invalid() {
            out.push_str(&format!("<0x{b:02X}>"));
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_pieces_are_shown_as_bytes() {
        assert_eq!(super::piece_text(b"hi\n"), "\"hi\\n\"");
        assert_eq!(super::piece_text(&[0xF0, 0x9F]), "\"<0xF0><0x9F>\"");
        assert_eq!(super::piece_text("é".as_bytes()), "\"é\"");
    }
}
