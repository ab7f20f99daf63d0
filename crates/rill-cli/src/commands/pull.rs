//! `rill pull NAME`.

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// A built-in model name (smollm2-135m, gemma3-270m) or hf:OWNER/REPO/FILE.gguf.
    pub name: String,
}

pub fn main(args: Args) -> Result<()> {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::pull(&args.name, &opts)?;
    println!("{}", path.display());
    Ok(())
}
