//! Compiles every kernel source with NVRTC, without a GPU.
//!
//! Needs libnvrtc on the loader path, e.g.
//! `LD_LIBRARY_PATH=$VENV/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib`.
//! When libnvrtc cannot be loaded at all each test prints `SKIP:` and passes; a compile
//! error or a missing entry point fails. `DLPART_REQUIRE_NVRTC` (any value) makes a missing
//! libnvrtc fail; `DLPART_NVRTC_MAJOR=N` also fails unless the loaded NVRTC is version N.
#![cfg(feature = "cuda")]

use std::collections::BTreeSet;

use dlpart::backend::cuda::nvrtc::{self, Image, KernelSource, SOURCES};
use dlpart::Error;

/// `None` (after printing the reason) when libnvrtc is not loadable on this machine.
fn nvrtc_or_skip(test: &str) -> Option<(i32, i32)> {
    match nvrtc::version() {
        Ok(v) => {
            if let Some(want) = std::env::var_os("DLPART_NVRTC_MAJOR") {
                let want = want.to_string_lossy();
                assert_eq!(
                    v.0.to_string(),
                    want,
                    "{test}: NVRTC {}.{} loaded",
                    v.0,
                    v.1
                );
            }
            Some(v)
        }
        Err(Error::BackendUnavailable { reason, .. }) => {
            // CI installs libnvrtc and sets this, so a broken loader fails instead of skipping.
            if std::env::var_os("DLPART_REQUIRE_NVRTC").is_some() {
                panic!("{test}: DLPART_REQUIRE_NVRTC is set but NVRTC is unavailable: {reason}");
            }
            eprintln!("SKIP {test}: {reason}");
            None
        }
        Err(e) => panic!("NVRTC is present but failed: {e}"),
    }
}

/// The `extern "C"` kernels the backend launches, spelled out independently of `SOURCES`.
fn expected_entries() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ["copy_box", "gather", "scatter"]
        .iter()
        .flat_map(|f| [1, 2, 4, 8, 16].map(|w| format!("{f}_{w}")))
        .collect();
    names.insert("scatter_winners".into());
    names.extend([1, 2, 4, 8].map(|w| format!("check_indices_{w}")));
    names
}

fn ptx_entries(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| l.split(".entry ").nth(1))
        .map(|rest| rest.split('(').next().unwrap().trim().to_string())
        .collect()
}

#[test]
fn every_kernel_compiles_to_ptx_with_its_entry_points() {
    let Some(version) = nvrtc_or_skip("every_kernel_compiles_to_ptx_with_its_entry_points") else {
        return;
    };
    eprintln!("NVRTC {}.{}", version.0, version.1);
    let mut all = BTreeSet::new();
    for arch in ["compute_80", "compute_90"] {
        for src in &SOURCES {
            let ptx = nvrtc::compile_ptx(src, arch).unwrap_or_else(|e| {
                panic!("kernels/{} does not compile for {arch}:\n{e}", src.name)
            });
            let found = ptx_entries(&ptx);
            for &e in src.entries {
                assert!(
                    found.contains(e),
                    "{arch}: .entry {e} missing from kernels/{}",
                    src.name
                );
            }
            assert!(
                ptx.contains(&format!(".target sm_{}", &arch[8..])),
                "{arch}: wrong target"
            );
            // Aligned runs must become 16-byte vector accesses, not four scalar ones.
            if src.name == "copy.cu" {
                assert!(
                    ptx.contains("ld.global.nc.v2.u64"),
                    "{arch}: no 16-byte loads"
                );
                assert!(
                    ptx.contains("st.global.wb.v2.u64"),
                    "{arch}: no 16-byte stores"
                );
            }
            assert!(
                !ptx.contains(".local"),
                "{arch}: kernels/{} uses local memory",
                src.name
            );
            all.extend(found);
        }
    }
    assert_eq!(all, expected_entries());
    let listed: BTreeSet<String> = SOURCES
        .iter()
        .flat_map(|s| s.entries)
        .map(|e| e.to_string())
        .collect();
    assert_eq!(listed, expected_entries());
}

#[test]
fn kernels_compile_to_cubin_for_hopper_and_ampere() {
    let Some(_) = nvrtc_or_skip("kernels_compile_to_cubin_for_hopper_and_ampere") else {
        return;
    };
    let archs = nvrtc::supported_archs().unwrap();
    assert!(
        archs.contains(&80) && archs.contains(&90),
        "supported: {archs:?}"
    );
    for arch in ["sm_80", "sm_90"] {
        for src in &SOURCES {
            match nvrtc::compile(src, arch) {
                Ok(Image::Cubin(bin)) => assert_eq!(&bin[..4], b"\x7fELF", "{arch} {}", src.name),
                Ok(Image::Ptx(_)) => panic!("{arch}: expected a CUBIN"),
                Err(e) => panic!("kernels/{} does not compile for {arch}:\n{e}", src.name),
            }
        }
    }
}

#[test]
fn a_broken_source_fails_with_the_compiler_log() {
    let Some(_) = nvrtc_or_skip("a_broken_source_fails_with_the_compiler_log") else {
        return;
    };
    let broken = KernelSource {
        name: "broken.cu",
        text: "#include \"common.cuh\"\nextern \"C\" __global__ void k() { undefined_name(); }\n",
        entries: &["k"],
    };
    let e = nvrtc::compile_ptx(&broken, "compute_90")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("broken.cu") && e.contains("undefined_name"),
        "{e}"
    );
}

#[test]
fn the_device_architecture_is_compiled_natively_when_known() {
    let supported = [75, 80, 86, 89, 90];
    assert_eq!(nvrtc::arch_for((9, 0), &supported).unwrap(), "sm_90");
    assert_eq!(nvrtc::arch_for((8, 6), &supported).unwrap(), "sm_86");
    // A device newer than this NVRTC gets PTX for the newest architecture below it.
    assert_eq!(nvrtc::arch_for((10, 0), &supported).unwrap(), "compute_90");
    assert!(matches!(
        nvrtc::arch_for((7, 0), &supported),
        Err(Error::BackendUnavailable { .. })
    ));
}

#[test]
fn every_cu_file_is_embedded_and_compiled() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    let embedded: BTreeSet<String> = SOURCES.iter().map(|s| s.name.to_string()).collect();
    assert_eq!(on_disk, embedded, "kernels/*.cu and nvrtc::SOURCES differ");
    for s in &SOURCES {
        let file = std::fs::read_to_string(dir.join(s.name)).unwrap();
        assert_eq!(file, s.text, "{} is stale in the build", s.name);
        let include_left = s
            .full_text()
            .lines()
            .any(|l| l.trim_start().starts_with("#include"));
        assert!(!include_left, "{}: an include is left for NVRTC", s.name);
    }
}
