// Compiles csrc/kernels.cpp against the libtorch headers (the same ones tch's torch-sys uses) and
// embeds the rpath every libtorch crate gets (build-support/torch_rpath.rs).
mod torch_rpath {
    include!("../../build-support/torch_rpath.rs");
    pub fn emit() {
        main()
    }
}

use std::path::PathBuf;

fn main() {
    torch_rpath::emit();
    println!("cargo:rerun-if-changed=csrc/kernels.cpp");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let libtorch = PathBuf::from(
        std::env::var("LIBTORCH")
            .expect("LIBTORCH is set by .cargo/config.toml (scripts/setup-env.sh makes it)"),
    );
    // `.cargo/config.toml` gives LIBTORCH relative to the workspace root.
    let libtorch = if libtorch.is_relative() {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(libtorch)
    } else {
        libtorch
    };
    let include = libtorch.join("include");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag("-Wno-psabi")
        .opt_level(3)
        .file("csrc/kernels.cpp")
        .compile("temper_kernels");
}
