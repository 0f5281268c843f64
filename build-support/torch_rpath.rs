// The build script of every crate that links libtorch (set as `build = ...` in its Cargo.toml).
//
// It embeds an rpath to PyTorch's lib folder in the project venv, so `temper` and the test binaries
// run without LD_LIBRARY_PATH (cargo does not pass `[env] LD_LIBRARY_PATH` on to test runs).
// The two relative entries cover target/debug/temper and target/debug/deps/*; the absolute one a
// binary copied elsewhere on the same machine.
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
