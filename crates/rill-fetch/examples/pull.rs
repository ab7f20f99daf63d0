//! Manual check: `cargo run -p rill-fetch --release --example pull -- [SPEC]` resolves a model
//! spec (default: the default model) with progress shown and prints the resulting path.

fn main() {
    let spec = std::env::args()
        .nth(1)
        .unwrap_or_else(|| rill_fetch::DEFAULT_MODEL.to_string());
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let start = std::time::Instant::now();
    match rill_fetch::pull(&spec, &opts) {
        Ok(path) => println!("{} ({:.1?})", path.display(), start.elapsed()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
