// Embed an rpath to PyTorch's lib folder so this crate's test binaries run without LD_LIBRARY_PATH.
// Two relative entries cover target/{debug,release}/temper and target/*/deps/*; the absolute one covers
// a binary copied elsewhere on the same machine.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let torch_lib = root.join(".venv/site/torch/lib");
    for rel in [
        "$ORIGIN/../../.venv/site/torch/lib",
        "$ORIGIN/../../../.venv/site/torch/lib",
    ] {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{rel}");
    }
    if let Ok(abs) = torch_lib.canonicalize() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", abs.display());
    }
}
