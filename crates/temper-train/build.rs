// Embed an rpath to PyTorch's lib folder (in the project venv) so this crate's test binaries find
// libtorch without LD_LIBRARY_PATH (cargo does not pass `[env] LD_LIBRARY_PATH` to test runs).
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for rel in [
        "$ORIGIN/../../.venv/site/torch/lib",
        "$ORIGIN/../../../.venv/site/torch/lib",
    ] {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{rel}");
    }
    if let Ok(abs) = root.join(".venv/site/torch/lib").canonicalize() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", abs.display());
    }
}
