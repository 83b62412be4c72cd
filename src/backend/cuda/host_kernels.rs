//! The kernels of kernels/*.cu compiled for the host (feature `kernel-host-tests`, built by
//! build.rs from kernels/host/), launched with the driver's calling convention: each
//! parameter points at one argument value, as for `cuLaunchKernel`. A launch runs its threads
//! one at a time in an order picked by a seed, and checks every global access (see
//! kernels/host/shim.h). Tests only: the emulated driver (`emulated.rs`) launches through it.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// A buffer the kernels of one launch may touch: `len` bytes from `addr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Region {
    addr: u64,
    len: u64,
    writable: u32,
    reserved: u32,
}

impl Region {
    pub fn new(addr: u64, len: usize, writable: bool) -> Region {
        Region {
            addr,
            len: len as u64,
            writable: u32::from(writable),
            reserved: 0,
        }
    }
}

/// The first bad global access of a launch (`DlpHostFault` in kernels/host/launch.cpp).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fault {
    pub addr: u64,
    pub size: u32,
    /// 1: misaligned (the GPU faults), 2: outside every region, 3: a store to a read-only one.
    pub kind: u32,
}

/// Why a host launch did not complete cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchError {
    UnknownEntry,
    /// A grid of 0 blocks, or a block of other than `DLP_BLOCK` threads.
    BadShape,
    Fault(Fault),
}

extern "C" {
    fn dlp_host_entry(i: usize) -> *const c_char;
    fn dlp_host_launch(
        entry: *const c_char,
        grid: u32,
        block: u32,
        params: *mut *mut c_void,
        seed: u64,
        regions: *const Region,
        nregions: usize,
        fault: *mut Fault,
    ) -> c_int;
}

/// The kernels the host build has.
pub fn entries() -> Vec<String> {
    let mut out = Vec::new();
    loop {
        // SAFETY: `dlp_host_entry` takes any index and returns NULL or a static C string.
        let p = unsafe { dlp_host_entry(out.len()) };
        if p.is_null() {
            return out;
        }
        // SAFETY: non-null: a NUL-terminated string literal of launch.cpp.
        out.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
    }
}

/// Runs kernel `entry` over `grid` blocks of `block` threads on the calling thread. With
/// `regions` non-empty, a global access outside them is dropped and reported.
///
/// # Safety
/// `params` must match the kernel's signature in kernels/*.cu, each element pointing at a
/// live value of that parameter's type. The job tables and status words the parameters name
/// must be valid for the kernel's plain reads and writes (those are not checked), and every
/// other address the kernel derives must be valid memory, or lie outside `regions` when
/// `regions` is non-empty.
pub unsafe fn launch(
    entry: &str,
    grid: u32,
    block: u32,
    params: &mut [*mut c_void],
    seed: u64,
    regions: &[Region],
) -> Result<(), LaunchError> {
    let name = CString::new(entry).map_err(|_| LaunchError::UnknownEntry)?;
    let mut fault = Fault::default();
    // SAFETY: `name`, `regions` and `fault` outlive the call; the caller vouches for
    // `params` and the memory they lead to.
    let rc = unsafe {
        dlp_host_launch(
            name.as_ptr(),
            grid,
            block,
            params.as_mut_ptr(),
            seed,
            regions.as_ptr(),
            regions.len(),
            &mut fault,
        )
    };
    match rc {
        0 => Ok(()),
        1 => Err(LaunchError::Fault(fault)),
        -1 => Err(LaunchError::UnknownEntry),
        _ => Err(LaunchError::BadShape),
    }
}

#[cfg(test)]
#[path = "host_kernels_tests.rs"]
mod tests;
