//! With the `kernel-host-tests` feature, compiles the kernel sources for the host (see
//! kernels/host/launch.cpp); otherwise does nothing, so the library needs no C++ compiler.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "kernel-host-tests")]
    host_kernels();
}

#[cfg(feature = "kernel-host-tests")]
fn host_kernels() {
    for f in [
        "kernels/common.cuh",
        "kernels/copy.cu",
        "kernels/index.cu",
        "kernels/host/shim.h",
        "kernels/host/launch.cpp",
    ] {
        println!("cargo::rerun-if-changed={f}");
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        // The tests run millions of kernel threads; unoptimised they take minutes.
        .opt_level(2)
        .file("kernels/host/launch.cpp")
        .include("kernels")
        .include("kernels/host")
        // The kernels move words through pointer casts, as CUDA code does.
        .flag("-fno-strict-aliasing")
        .flag_if_supported("-Wno-unknown-pragmas")
        // dlp_run loads a job's geometry on its first tile (job_end starts at 0), which GCC
        // cannot prove at -O2.
        .flag_if_supported("-Wno-maybe-uninitialized")
        .warnings_into_errors(true)
        .compile("dlpart_host_kernels");
}
