//! The few driver operations the CUDA backend uses, behind one interface: cudarc on a GPU
//! (`cudarc_driver.rs`), and a host emulation for the tests (`emulated.rs`, feature
//! `kernel-host-tests`), so that everything above it (job building, index checks, transfers,
//! scratch, stream waits, staging) runs without a GPU.
//!
//! Addresses of device memory are `u64`; streams and events are raw handles as `u64`
//! (streams as DLPack hands them around: 1 legacy, 2 per-thread, else a `CUstream`). All
//! asynchronous operations go to the driver's own stream unless a stream is named.

use std::any::Any;
use std::ffi::c_void;

use cudarc::driver::sys;

use super::jobs::WORDS;
use crate::error::Result;

/// One kernel of kernels/*.cu, by family and word (item) size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// `copy_box_W`, W in [`WORDS`].
    Copy(usize),
    /// `gather_W`, W in [`WORDS`].
    Gather(usize),
    /// `scatter_W`, W in [`WORDS`].
    Scatter(usize),
    /// `scatter_winners`.
    Winners,
    /// `check_indices_W`, W in [`INDEX_WORDS`].
    Check(usize),
}

/// The index widths `check_indices` is stamped for: every integer dtype.
pub(crate) const INDEX_WORDS: [usize; 4] = [1, 2, 4, 8];

const COPY: [&str; 5] = [
    "copy_box_1",
    "copy_box_2",
    "copy_box_4",
    "copy_box_8",
    "copy_box_16",
];
const GATHER: [&str; 5] = ["gather_1", "gather_2", "gather_4", "gather_8", "gather_16"];
const SCATTER: [&str; 5] = [
    "scatter_1",
    "scatter_2",
    "scatter_4",
    "scatter_8",
    "scatter_16",
];
const CHECK: [&str; 4] = [
    "check_indices_1",
    "check_indices_2",
    "check_indices_4",
    "check_indices_8",
];

impl Kernel {
    /// The `extern "C"` name the driver looks the kernel up by.
    pub fn entry(self) -> &'static str {
        let at = |words: &[usize], w: usize| {
            words
                .iter()
                .position(|&x| x == w)
                .expect("a word size the kernels are stamped for")
        };
        match self {
            Kernel::Copy(w) => COPY[at(&WORDS, w)],
            Kernel::Gather(w) => GATHER[at(&WORDS, w)],
            Kernel::Scatter(w) => SCATTER[at(&WORDS, w)],
            Kernel::Winners => "scatter_winners",
            Kernel::Check(w) => CHECK[at(&INDEX_WORDS, w)],
        }
    }
}

/// A device's context made current on the calling thread by [`Driver::bind`], for as long as
/// this value lives. When it goes, the context that was current before is current again (or
/// none, if none was): dlpart binds the primary context, the one the CUDA runtime's
/// `cudaSetDevice` makes current, so leaving it current would silently change the current
/// device of torch, cupy or any other runtime user on this thread.
///
/// Bindings nest: an inner one (another device's, for a peer) restores the outer one. They
/// must be dropped in the reverse order of their making, which scoped locals guarantee. Not
/// `Send`: a current context belongs to one thread.
#[must_use = "the context is current only while the binding lives"]
pub(crate) struct Bound {
    /// The context to make current again on drop (null: none); `None` when the binding
    /// changed nothing.
    restore: Option<sys::CUcontext>,
}

impl Bound {
    /// A binding that changed nothing and restores nothing (the context was current already,
    /// or there is no real driver).
    pub fn unchanged() -> Bound {
        Bound { restore: None }
    }

    /// A binding that makes `previous` (null: no context) current again when it goes.
    ///
    /// # Safety
    /// libcuda is loaded, and `previous` is null or the context that was current on the
    /// calling thread when the binding began (its owner keeps it alive while it is current
    /// there).
    pub unsafe fn restoring(previous: sys::CUcontext) -> Bound {
        Bound {
            restore: Some(previous),
        }
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(previous) = self.restore {
            // SAFETY: `restoring`'s contract: libcuda is loaded and `previous` is null (which
            // leaves no context current) or a live context that was current on this thread
            // (the value is `!Send`, so this is that thread). An error cannot be reported from
            // a drop; the thread then keeps dlpart's context current, as it did before.
            let _ = unsafe { sys::cuCtxSetCurrent(previous) };
        }
    }
}

/// The driver of one device, as the backend sees it.
///
/// The `unsafe` methods take device addresses that the driver cannot check on a GPU: the
/// caller guarantees they lie in live allocations with room for the bytes named.
pub(crate) trait Driver: Send + Sync {
    /// This driver as `Any`, so that peers of the same kind can be told apart.
    fn as_any(&self) -> &dyn Any;

    /// Makes the device's context current on the calling thread until the returned binding
    /// goes, which makes the context current before current again. Hold it for the whole
    /// operation (launches, copies and the synchronisation that ends them).
    fn bind(&self) -> Result<Bound>;

    /// The number of multiprocessors, which caps launch grids.
    fn sm_count(&self) -> u32;

    /// The handle of the stream all of the backend's work is queued on (> 2).
    fn stream(&self) -> u64;

    /// Compiles and loads the kernels, once; later calls return at once.
    fn load_kernels(&self) -> Result<()>;

    /// `bytes` (> 0) of uninitialised device memory, 256-byte aligned.
    fn alloc(&self, bytes: usize) -> Result<u64>;

    /// Frees memory from [`Driver::alloc`], once all work using it is done.
    ///
    /// # Safety
    /// `ptr` came from `alloc` of this driver and is freed once.
    unsafe fn free(&self, ptr: u64);

    /// `bytes` (> 0) of page-locked host memory.
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8>;

    /// Frees memory from [`Driver::alloc_pinned`].
    ///
    /// # Safety
    /// `ptr` came from `alloc_pinned` of this driver, is freed once, and no queued copy
    /// still uses it.
    unsafe fn free_pinned(&self, ptr: *mut u8);

    /// Queues the zeroing of `bytes` bytes at `dst`.
    ///
    /// # Safety
    /// `dst..dst + bytes` lies in one live allocation of this device.
    unsafe fn memset_zero(&self, dst: u64, bytes: usize) -> Result<()>;

    /// Queues a copy of `src` to `dst`. A pageable `src` is consumed before the call returns;
    /// a pinned one must stay untouched until the copy has run.
    ///
    /// # Safety
    /// `dst..dst + src.len()` lies in one live device allocation.
    unsafe fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()>;

    /// Queues a copy of `dst.len()` bytes from `src` into `dst`, after the work queued before.
    /// Into pageable memory it returns once the copy is done; into pinned memory the caller
    /// synchronises before reading `dst`.
    ///
    /// # Safety
    /// `src..src + dst.len()` lies in one live device allocation.
    unsafe fn copy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<()>;

    /// Queues `kernel` over `grid` blocks of `BLOCK` threads.
    ///
    /// # Safety
    /// `params` match the kernel's signature in kernels/*.cu, each pointing at a live value of
    /// that parameter's type, and every address the kernel derives from them is valid.
    unsafe fn launch(&self, kernel: Kernel, grid: u32, params: &mut [*mut c_void]) -> Result<()>;

    /// Waits until all work queued on the stream is done.
    fn synchronize(&self) -> Result<()>;

    /// A new event (no timing).
    fn event_create(&self) -> Result<u64>;

    /// Records `event` on `stream` (a stream of this device, or 1 or 2).
    ///
    /// # Safety
    /// `event` is live; `stream` is a live stream of this device's context.
    unsafe fn event_record(&self, event: u64, stream: u64) -> Result<()>;

    /// Blocks the host until `event` has fired.
    ///
    /// # Safety
    /// `event` is live.
    unsafe fn event_synchronize(&self, event: u64) -> Result<()>;

    /// Makes `stream` wait (on the device) for `event`.
    ///
    /// # Safety
    /// As for [`Driver::event_record`].
    unsafe fn stream_wait_event(&self, stream: u64, event: u64) -> Result<()>;

    /// Destroys `event`; a pending wait on it still resolves.
    ///
    /// # Safety
    /// `event` came from `event_create` of this driver and is destroyed once.
    unsafe fn event_destroy(&self, event: u64) -> Result<()>;

    /// Lets this device's kernels read `peer`'s memory; false when they cannot.
    fn enable_peer_access(&self, peer: &dyn Driver) -> Result<bool>;
}
