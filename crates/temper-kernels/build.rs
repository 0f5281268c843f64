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
    // c10d (csrc/comm.cpp) needs the gloo headers, which PyTorch's wheel does not ship;
    // scripts/setup-env.sh installs Debian's libgloo-dev. Without them, a stub says so at run time.
    println!("cargo:rerun-if-changed=csrc/comm.cpp");
    println!("cargo:rerun-if-changed=csrc/guarded.h");
    println!("cargo:rerun-if-changed=csrc/comm_stub.cpp");
    println!("cargo:rerun-if-env-changed=GLOO_INCLUDE");
    let gloo = std::env::var_os("GLOO_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include"));
    println!(
        "cargo:rerun-if-changed={}",
        gloo.join("gloo/config.h").display()
    );
    let have_c10d = gloo.join("gloo/config.h").exists()
        && include
            .join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
            .exists();
    let mut build = cc::Build::new();
    build
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
        .file("csrc/kernels.cpp");
    if have_c10d {
        if gloo != std::path::Path::new("/usr/include") {
            // Never `-I/usr/include`: it reorders the system headers libstdc++ expects.
            build.include(&gloo);
        }
        build.define("USE_C10D_GLOO", None).file("csrc/comm.cpp");
    } else {
        println!(
            "cargo:warning=gloo headers not found under {}: temper is built without c10d \
             (data-parallel training); scripts/setup-env.sh installs them",
            gloo.display()
        );
        build.file("csrc/comm_stub.cpp");
    }
    build.compile("temper_kernels");
}
