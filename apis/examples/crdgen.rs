//! Writes the CRDs generated from the types into `deploy/crds/` (a test checks they match).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    std::fs::create_dir_all(&dir)?;
    for (file, crd) in apis::runtime::crds() {
        std::fs::write(dir.join(file), serde_norway::to_string(&crd)?)?;
        println!("wrote deploy/crds/{file}");
    }
    Ok(())
}
