//! Row copies with non-temporal (streaming) stores.
//!
//! A plain store to a line not in cache first reads the line (read-for-ownership), so a copy
//! far larger than the cache moves three bytes over the memory bus per byte copied. Streaming
//! stores write whole lines without reading them. They pay off only when the destination will
//! not be read again soon and is much larger than the last-level cache; the scheduler decides
//! ([`super::copy::Stores`]). On other targets, and under Miri, these are plain copies.

/// How a kernel stores rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Store {
    Plain,
    Stream,
}

/// Rows shorter than this are stored plainly even in streaming mode: a partial line written
/// with streaming stores costs a full memory round trip.
pub(crate) const STREAM_MIN_ROW: usize = 256;

/// Copies `len` bytes from `src` to `dst` (not overlapping) with `store`.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the ranges must not overlap.
#[inline]
pub(crate) unsafe fn copy_row(dst: *mut u8, src: *const u8, len: usize, store: Store) {
    if len <= 32 {
        // SAFETY: forwarded caller contract.
        unsafe { copy_small(dst, src, len) }
    } else if store == Store::Stream && len >= STREAM_MIN_ROW {
        // SAFETY: forwarded caller contract.
        unsafe { copy_streaming(dst, src, len) }
    } else {
        // SAFETY: forwarded caller contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// As [`copy_row`], but in streaming mode also streams rows of whole, aligned cache lines
/// however short: for rows written one after another across a row group, where the lines
/// of each row are complete when the row is.
///
/// # Safety
/// As for [`copy_row`].
#[inline]
pub(crate) unsafe fn copy_lines(dst: *mut u8, src: *const u8, len: usize, store: Store) {
    if store == Store::Stream && len >= 64 && len % 64 == 0 && (dst as usize) % 64 == 0 {
        // SAFETY: forwarded caller contract.
        unsafe { copy_streaming(dst, src, len) }
    } else {
        // SAFETY: forwarded caller contract.
        unsafe { copy_row(dst, src, len, store) }
    }
}

/// Copies up to 32 bytes inline, as two overlapping words: tiny rows are common (small boxes,
/// narrow blocks) and a call to `memcpy` would cost more than the copy.
///
/// # Safety
/// As for [`copy_row`], with `len <= 32`.
#[inline(always)]
unsafe fn copy_small(dst: *mut u8, src: *const u8, len: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY: every access lies in the first or last word of the `len` bytes, both inside the
    // caller's ranges; unaligned accesses are allowed.
    unsafe {
        if len >= 16 {
            let (a, b) = (rd(src as *const u128), rd(src.add(len - 16) as *const u128));
            wr(dst as *mut u128, a);
            wr(dst.add(len - 16) as *mut u128, b);
        } else if len >= 8 {
            let (a, b) = (rd(src as *const u64), rd(src.add(len - 8) as *const u64));
            wr(dst as *mut u64, a);
            wr(dst.add(len - 8) as *mut u64, b);
        } else if len >= 4 {
            let (a, b) = (rd(src as *const u32), rd(src.add(len - 4) as *const u32));
            wr(dst as *mut u32, a);
            wr(dst.add(len - 4) as *mut u32, b);
        } else {
            for i in 0..len {
                *dst.add(i) = *src.add(i);
            }
        }
    }
}

/// Orders this thread's streaming stores before its later stores (and before a hand-off to
/// another thread). Call once after a batch of [`copy_row`] calls in streaming mode.
#[inline]
pub(crate) fn fence(store: Store) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if store == Store::Stream {
        // SAFETY: SSE is part of the x86_64 baseline, so the instruction always exists.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = store;
}

/// Whether this build has streaming stores at all.
pub(crate) fn available() -> bool {
    cfg!(all(target_arch = "x86_64", not(miri)))
}

/// Hints the CPU to fetch the line at `p` into cache; a no-op where unsupported.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch never faults and never dereferences in the language sense; any address
    // is allowed (SSE is part of the x86_64 baseline).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: AVX was detected at run time; forwarded caller contract.
        unsafe { x86::copy_avx(dst, src, len) }
    } else {
        // SAFETY: SSE2 is part of the x86_64 baseline; forwarded caller contract.
        unsafe { x86::copy_sse2(dst, src, len) }
    }
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;
    use std::ptr::copy_nonoverlapping;

    /// Bytes up to the next multiple of `align` at `dst`, at most `len`.
    fn head(dst: *mut u8, align: usize, len: usize) -> usize {
        ((align - (dst as usize & (align - 1))) & (align - 1)).min(len)
    }

    /// # Safety
    /// AVX must be available; `src` readable and `dst` writable for `len` bytes, disjoint.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn copy_avx(dst: *mut u8, src: *const u8, len: usize) {
        let h = head(dst, 32, len);
        // SAFETY: every access below stays inside the `len` bytes of the caller's contract;
        // stores go to 32-byte aligned addresses (`dst + h` is aligned, steps are 32).
        unsafe {
            copy_nonoverlapping(src, dst, h);
            let (mut s, mut d, mut n) = (src.add(h), dst.add(h), len - h);
            while n >= 128 {
                let a = _mm256_loadu_si256(s as *const __m256i);
                let b = _mm256_loadu_si256(s.add(32) as *const __m256i);
                let c = _mm256_loadu_si256(s.add(64) as *const __m256i);
                let e = _mm256_loadu_si256(s.add(96) as *const __m256i);
                _mm256_stream_si256(d as *mut __m256i, a);
                _mm256_stream_si256(d.add(32) as *mut __m256i, b);
                _mm256_stream_si256(d.add(64) as *mut __m256i, c);
                _mm256_stream_si256(d.add(96) as *mut __m256i, e);
                s = s.add(128);
                d = d.add(128);
                n -= 128;
            }
            while n >= 32 {
                _mm256_stream_si256(d as *mut __m256i, _mm256_loadu_si256(s as *const __m256i));
                s = s.add(32);
                d = d.add(32);
                n -= 32;
            }
            copy_nonoverlapping(s, d, n);
        }
    }

    /// # Safety
    /// `src` readable and `dst` writable for `len` bytes, disjoint.
    pub(super) unsafe fn copy_sse2(dst: *mut u8, src: *const u8, len: usize) {
        let h = head(dst, 16, len);
        // SAFETY: every access stays inside the caller's `len` bytes; stores are 16-aligned.
        unsafe {
            copy_nonoverlapping(src, dst, h);
            let (mut s, mut d, mut n) = (src.add(h), dst.add(h), len - h);
            while n >= 64 {
                let a = _mm_loadu_si128(s as *const __m128i);
                let b = _mm_loadu_si128(s.add(16) as *const __m128i);
                let c = _mm_loadu_si128(s.add(32) as *const __m128i);
                let e = _mm_loadu_si128(s.add(48) as *const __m128i);
                _mm_stream_si128(d as *mut __m128i, a);
                _mm_stream_si128(d.add(16) as *mut __m128i, b);
                _mm_stream_si128(d.add(32) as *mut __m128i, c);
                _mm_stream_si128(d.add(48) as *mut __m128i, e);
                s = s.add(64);
                d = d.add(64);
                n -= 64;
            }
            while n >= 16 {
                _mm_stream_si128(d as *mut __m128i, _mm_loadu_si128(s as *const __m128i));
                s = s.add(16);
                d = d.add(16);
                n -= 16;
            }
            copy_nonoverlapping(s, d, n);
        }
    }
}
