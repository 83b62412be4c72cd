//! The kernel sources and their run-time compilation with NVRTC.
//!
//! The `.cu` files are embedded with `include_str!`; `#include "common.cuh"` is replaced by
//! the header's text because NVRTC is given no include paths (and has no system headers).
//! For a device whose architecture this NVRTC knows, we compile straight to a CUBIN
//! (`sm_XY`): loading SASS needs no PTX JIT, so a driver older than the NVRTC still works.
//! Otherwise we fall back to PTX for the newest virtual architecture below the device's.

use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::nvrtc::{result, sys};

use crate::error::{Error, Result};

/// The shared header, inlined into every source.
pub const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// One `.cu` file and the `extern "C"` kernels it defines.
#[derive(Debug)]
pub struct KernelSource {
    /// The file name under `kernels/`, as compiler messages give it.
    pub name: &'static str,
    /// The file's text, `#include "common.cuh"` still in place.
    pub text: &'static str,
    /// The kernels it defines, as the driver looks them up.
    pub entries: &'static [&'static str],
}

/// Every kernel source dlpart compiles.
pub const SOURCES: [KernelSource; 2] = [
    KernelSource {
        name: "copy.cu",
        text: include_str!("../../../kernels/copy.cu"),
        entries: &[
            "copy_box_1",
            "copy_box_2",
            "copy_box_4",
            "copy_box_8",
            "copy_box_16",
        ],
    },
    KernelSource {
        name: "index.cu",
        text: include_str!("../../../kernels/index.cu"),
        entries: &[
            "gather_1",
            "gather_2",
            "gather_4",
            "gather_8",
            "gather_16",
            "scatter_1",
            "scatter_2",
            "scatter_4",
            "scatter_8",
            "scatter_16",
            "scatter_winners",
            "check_indices_1",
            "check_indices_2",
            "check_indices_4",
            "check_indices_8",
        ],
    },
];

const INCLUDE: &str = "#include \"common.cuh\"";

impl KernelSource {
    /// The source with the shared header inlined, as handed to NVRTC.
    pub fn full_text(&self) -> String {
        self.text.replacen(INCLUDE, COMMON, 1)
    }
}

/// A compiled module image, ready for `cuModuleLoadData`.
#[derive(Clone, Debug)]
pub enum Image {
    /// Machine code for one architecture (`sm_XY`).
    Cubin(Vec<u8>),
    /// PTX for a virtual architecture (`compute_XY`), JIT-compiled by the driver on load.
    Ptx(String),
}

fn unavailable(reason: String) -> Error {
    Error::BackendUnavailable {
        backend: "cuda",
        reason,
    }
}

fn nvrtc_error(op: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend {
        backend: "cuda",
        op: op.into(),
        message: format!("{e:?}"),
    }
}

/// Runs `f`, turning a failure to load libnvrtc (cudarc panics) into `BackendUnavailable`.
fn with_nvrtc<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: only probes whether the shared library can be opened; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable(
            "libnvrtc could not be loaded: put the directory holding libnvrtc.so.13 or \
             libnvrtc.so.12 on LD_LIBRARY_PATH (for example site-packages/nvidia/cu13/lib \
             from the nvidia-cuda-nvrtc wheel, or site-packages/nvidia/cuda_nvrtc/lib from \
             nvidia-cuda-nvrtc-cu12)"
                .into(),
        ));
    }
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        Err(unavailable(format!("libnvrtc could not be used: {msg}")))
    })
}

/// The NVRTC version, `(major, minor)`; `BackendUnavailable` if libnvrtc cannot be loaded.
pub fn version() -> Result<(i32, i32)> {
    with_nvrtc(|| {
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: both out-pointers are valid for writes.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| nvrtc_error("nvrtcVersion", e))?;
        Ok((major, minor))
    })
}

/// The real architectures (e.g. 90 for sm_90) this NVRTC can compile for.
pub fn supported_archs() -> Result<Vec<i32>> {
    with_nvrtc(|| {
        let mut n: c_int = 0;
        // SAFETY: `n` is valid for writes.
        unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }
            .result()
            .map_err(|e| nvrtc_error("nvrtcGetNumSupportedArchs", e))?;
        let mut archs = vec![0 as c_int; n.max(0) as usize];
        // SAFETY: `archs` has room for the `n` entries NVRTC writes.
        unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
            .result()
            .map_err(|e| nvrtc_error("nvrtcGetSupportedArchs", e))?;
        Ok(archs)
    })
}

/// An NVRTC program, destroyed on drop. Holds the source so it outlives the program.
struct Program {
    prog: sys::nvrtcProgram,
    _src: CString,
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by `create_program` and is destroyed only here.
        let _ = unsafe { result::destroy_program(self.prog) };
    }
}

fn read_log(prog: sys::nvrtcProgram) -> String {
    // SAFETY: `prog` is a live program (owned by the caller's `Program`).
    match unsafe { result::get_program_log(prog) } {
        Ok(log) => {
            let bytes: Vec<u8> = log
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// Compiles `src` for `arch` (`sm_90` for a CUBIN, `compute_90` for PTX).
pub fn compile(src: &KernelSource, arch: &str) -> Result<Image> {
    with_nvrtc(|| {
        let text = CString::new(src.full_text()).expect("kernel sources contain no NUL");
        let name = CString::new(src.name).expect("file names contain no NUL");
        let prog = result::create_program(&text, Some(&name))
            .map_err(|e| nvrtc_error("nvrtcCreateProgram", e))?;
        let prog = Program { prog, _src: text };
        let options = [format!("--gpu-architecture={arch}"), "--std=c++17".into()];
        // SAFETY: `prog.prog` is live; options are plain strings.
        if let Err(e) = unsafe { result::compile_program(prog.prog, &options) } {
            return Err(Error::Backend {
                backend: "cuda",
                op: format!("NVRTC compilation of kernels/{} for {arch}", src.name),
                message: format!("{e:?}\n{}", read_log(prog.prog)),
            });
        }
        if arch.starts_with("sm_") {
            let mut size = 0usize;
            // SAFETY: `prog.prog` is compiled; `size` is valid for writes.
            unsafe { sys::nvrtcGetCUBINSize(prog.prog, &mut size) }
                .result()
                .map_err(|e| nvrtc_error("nvrtcGetCUBINSize", e))?;
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` has the `size` bytes NVRTC writes.
            unsafe { sys::nvrtcGetCUBIN(prog.prog, cubin.as_mut_ptr() as *mut c_char) }
                .result()
                .map_err(|e| nvrtc_error("nvrtcGetCUBIN", e))?;
            Ok(Image::Cubin(cubin))
        } else {
            // SAFETY: `prog.prog` is compiled.
            let ptx =
                unsafe { result::get_ptx(prog.prog) }.map_err(|e| nvrtc_error("nvrtcGetPTX", e))?;
            // SAFETY: NVRTC returns a NUL-terminated string.
            let ptx = unsafe { CStr::from_ptr(ptx.as_ptr()) };
            Ok(Image::Ptx(ptx.to_string_lossy().into_owned()))
        }
    })
}

/// Compiles `src` to PTX text for the virtual architecture `compute_XY`.
pub fn compile_ptx(src: &KernelSource, arch: &str) -> Result<String> {
    match compile(src, arch)? {
        Image::Ptx(p) => Ok(p),
        Image::Cubin(_) => Err(nvrtc_error(
            "compile_ptx",
            format!("{arch} is not a compute_ arch"),
        )),
    }
}

/// The architecture to compile for on a device of compute capability `(major, minor)`.
pub fn arch_for(cc: (i32, i32), supported: &[i32]) -> Result<String> {
    let want = cc.0 * 10 + cc.1;
    if supported.contains(&want) {
        return Ok(format!("sm_{want}"));
    }
    supported
        .iter()
        .copied()
        .filter(|&a| a <= want)
        .max()
        .map(|a| format!("compute_{a}"))
        .ok_or_else(|| {
            unavailable(format!(
                "this NVRTC supports {supported:?}, none at or below compute capability {}.{}",
                cc.0, cc.1
            ))
        })
}
