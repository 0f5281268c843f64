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
    println!("cargo:rerun-if-changed=csrc/swiglu.cpp");
    println!("cargo:rerun-if-changed=csrc/optim.cpp");
    println!("cargo:rerun-if-changed=csrc/profiler.cpp");
    println!("cargo:rerun-if-changed=csrc/graph.cpp");
    println!("cargo:rerun-if-changed=csrc/graph_stub.cpp");
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
    // Whether tch links a CUDA libtorch: errors for `--device cuda` say which part is missing.
    let cuda_build = libtorch.join("lib/libtorch_cuda.so").exists();
    println!(
        "cargo:rustc-env=TEMPER_LIBTORCH_CUDA={}",
        u8::from(cuda_build)
    );
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
        .file("csrc/kernels.cpp")
        .file("csrc/swiglu.cpp")
        .file("csrc/optim.cpp")
        .file("csrc/profiler.cpp");
    // CUDA graphs (csrc/graph.cpp, the sampling engine's decode step) need CUDA's runtime
    // headers, the ones NCCL's needs: with them, a CUDA build captures; otherwise a stub says no.
    match nccl_includes(&libtorch, &include) {
        Some(dirs) => {
            for d in dirs {
                build.include(d);
            }
            build.file("csrc/graph.cpp");
            println!("cargo:rustc-link-lib=dylib=torch_cuda");
            println!("cargo:rustc-link-lib=dylib=c10_cuda");
        }
        None => {
            build.file("csrc/graph_stub.cpp");
        }
    }
    if have_c10d {
        if gloo != std::path::Path::new("/usr/include") {
            // Never `-I/usr/include`: it reorders the system headers libstdc++ expects.
            build.include(&gloo);
        }
        build.define("USE_C10D_GLOO", None).file("csrc/comm.cpp");
        // NCCL (CUDA builds): libtorch_cuda exports ProcessGroupNCCL; its header needs nccl.h and
        // CUDA's runtime and crt headers, which the CUDA wheels put under site-packages/nvidia
        // (TEMPER_CUDA=1 scripts/setup-env.sh installs nvidia-cuda-crt for crt/host_config.h and
        // nvidia-cuda-cccl for nv/target).
        if let Some(dirs) = nccl_includes(&libtorch, &include) {
            for d in dirs {
                build.include(d);
            }
            build.define("USE_C10D_NCCL", None);
            println!("cargo:rustc-link-lib=dylib=torch_cuda");
            // c10::cuda::set_device (comm.cpp picks the rank's GPU) lives in libc10_cuda.
            println!("cargo:rustc-link-lib=dylib=c10_cuda");
        }
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

/// The include folders a NCCL-enabled c10d shim needs, when this is a CUDA libtorch and they are
/// all present; `None` otherwise (a CPU build, or headers missing: Gloo only, said at run time).
fn nccl_includes(libtorch: &std::path::Path, include: &std::path::Path) -> Option<Vec<PathBuf>> {
    if !libtorch.join("lib/libtorch_cuda.so").exists()
        || !include
            .join("torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp")
            .exists()
    {
        return None;
    }
    // libtorch is site-packages/torch in a CUDA venv; the NVIDIA wheels sit beside it.
    let nvidia = libtorch.join("../nvidia");
    // CUDA 13's cuda_fp16.h includes CCCL's <nv/target> (pip's nvidia-cuda-cccl).
    let wanted = [
        "nccl.h",
        "cuda_runtime_api.h",
        "crt/host_config.h",
        "nv/target",
    ];
    let mut dirs: Vec<PathBuf> = vec![];
    for w in wanted {
        let found = std::fs::read_dir(&nvidia)
            .ok()?
            .flatten()
            .map(|e| e.path().join("include"))
            .find(|inc| inc.join(w).exists());
        match found {
            Some(d) => {
                if !dirs.contains(&d) {
                    dirs.push(d)
                }
            }
            None => {
                println!(
                    "cargo:warning=CUDA libtorch found but no {w} under {}: temper is built without NCCL",
                    nvidia.display()
                );
                return None;
            }
        }
    }
    Some(dirs)
}
