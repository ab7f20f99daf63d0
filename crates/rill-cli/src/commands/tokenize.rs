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
        let piece = tokenizer.decode_with(&[id], true);
        println!("{id:>8}  {piece:?}");
    }
    eprintln!("{} tokens", ids.len());
    Ok(())
}
