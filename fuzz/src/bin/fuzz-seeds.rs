//! Writes every target's seed inputs into `fuzz/corpus/<target>/` (checked in; run again
//! when an encoder changes): `cargo run -p dpufs-fuzz --bin fuzz-seeds`.

fn main() -> std::io::Result<()> {
    for (target, name, bytes) in dpufs_fuzz::seeds() {
        let dir = target.corpus();
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
    }
    Ok(())
}
