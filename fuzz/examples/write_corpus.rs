//! Writes the seed corpus ([`koala_fuzz::seeds`]) into `fuzz/corpus/<target>/`, with the
//! example job configs of `examples/*.toml` as config seeds:
//! `cargo run --example write_corpus` in `fuzz/`.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut examples = Vec::new();
    for entry in std::fs::read_dir(root.join("../examples"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "toml") {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            examples.push((format!("example-{name}"), std::fs::read_to_string(&path)?));
        }
    }
    examples.sort();
    let seeds = koala_fuzz::seeds::all(&examples);
    for seed in &seeds {
        let dir = root.join("corpus").join(seed.target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(&seed.name), &seed.bytes)?;
    }
    println!("wrote {} seeds under {}", seeds.len(), root.join("corpus").display());
    Ok(())
}
