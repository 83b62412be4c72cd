// Gather and scatter along one axis with int64 indices, and the check that turns a caller's
// indices into them. A job is an (outer, index, inner) box whose `axis` dim takes its source
// (gather) or destination (scatter) coordinate from the index array; contiguous inner runs
// are widened by the host like box copies.
#include "common.cuh"

// For every destination slot t, the address of the last index entry naming t: address order
// is position order, and an address stays unique when the host splits the index array
// across jobs. `winner` is the table `dlp_winner` reads (`slots` 0: one word per slot of the
// axis; otherwise hashed, sized by the number of indices) and must be zeroed first. Scatter
// then lets only that entry write, so later duplicates win deterministically.
extern "C" __global__ void __launch_bounds__(DLP_BLOCK)
    scatter_winners(const dlp_i64* __restrict__ index, dlp_u64 n, dlp_i64 len,
                    dlp_u64* winner, dlp_u64 slots, dlp_u64* status) {
    const dlp_u64 stride = (dlp_u64)gridDim.x * DLP_BLOCK;
    for (dlp_u64 p = (dlp_u64)blockIdx.x * DLP_BLOCK + threadIdx.x; p < n; p += stride) {
        const dlp_i64 t = __ldg(index + p);
        if (t < 0 || t >= len) {
            dlp_report_bad_index(status, t);
        } else if (slots == 0) {
            atomicMax(winner + t, (dlp_u64)(index + p));
        } else {
            // Linear probing from the key's hash: the first slot holding the key or empty
            // (claimed here). At most n < slots keys are ever inserted, so one is found.
            const dlp_u64 key = (dlp_u64)t + 1;
            for (dlp_u64 h = dlp_slot_hash(key) & (slots - 1);; h = (h + 1) & (slots - 1)) {
                const dlp_u64 was = atomicCAS(winner + h, 0ull, key);
                if (was == 0ull || was == key) {
                    atomicMax(winner + slots + h, (dlp_u64)(index + p));
                    break;
                }
            }
        }
    }
}

// Checks the `n` indices at `index` (`stride` words apart, signed or not) against an axis of
// length `len`, before any gather or scatter writes: a value in [-len, len) is valid, and a
// negative one counts from the end, as in numpy. status[0] ends as n - p for the lowest
// position p of an invalid value (0 when all are valid), so the host names the same index
// as the CPU backend whatever the thread order; status[1] as 1 when a valid value is
// negative. With `out` non-zero, out[p] receives every valid index moved into [0, len).
// `status` must be zeroed first.
template <typename U, typename S>
__device__ __forceinline__ void dlp_check_indices(const U* __restrict__ index, dlp_i64 stride,
                                                  dlp_u64 n, dlp_i64 len, dlp_u32 is_signed,
                                                  dlp_i64* __restrict__ out, dlp_u64* status) {
    const dlp_u64 step = (dlp_u64)gridDim.x * DLP_BLOCK;
    bool negative = false;
    for (dlp_u64 p = (dlp_u64)blockIdx.x * DLP_BLOCK + threadIdx.x; p < n; p += step) {
        const U raw = __ldg(index + (dlp_i64)p * stride);
        // Unsigned 64-bit values above INT64_MAX are out of range for any axis.
        const bool huge = !is_signed && (dlp_u64)raw > 0x7fffffffffffffffull;
        const dlp_i64 v = is_signed ? (dlp_i64)(S)raw : (dlp_i64)raw;
        if (huge || v < -len || v >= len) {
            atomicMax(status, n - p);
            continue;
        }
        negative |= v < 0;
        if (out != nullptr) {
            out[p] = v < 0 ? v + len : v;
        }
    }
    if (negative) {
        status[1] = 1; // every writer stores the same value
    }
}

#define DLP_CHECK_KERNEL(NAME, U, S)                                                         \
    extern "C" __global__ void __launch_bounds__(DLP_BLOCK)                                  \
        NAME(const U* __restrict__ index, dlp_i64 stride, dlp_u64 n, dlp_i64 len,            \
             dlp_u32 is_signed, dlp_i64* __restrict__ out, dlp_u64* status) {                \
        dlp_check_indices<U, S>(index, stride, n, len, is_signed, out, status);              \
    }

DLP_CHECK_KERNEL(check_indices_1, dlp_u8, signed char)
DLP_CHECK_KERNEL(check_indices_2, dlp_u16, short)
DLP_CHECK_KERNEL(check_indices_4, dlp_u32, int)
DLP_CHECK_KERNEL(check_indices_8, dlp_u64, dlp_i64)

#define DLP_INDEX_KERNEL(NAME, T, MODE)                                                      \
    extern "C" __global__ void __launch_bounds__(DLP_BLOCK)                                  \
        NAME(const DlpJob* __restrict__ jobs, dlp_u32 njobs, dlp_u32 ntiles,                 \
             const dlp_u64* __restrict__ winner, dlp_u64 slots, dlp_u64* status) {           \
        dlp_run<T, MODE>(jobs, njobs, ntiles, winner, slots, status);                        \
    }

DLP_INDEX_KERNEL(gather_1, dlp_u8, DLP_GATHER)
DLP_INDEX_KERNEL(gather_2, dlp_u16, DLP_GATHER)
DLP_INDEX_KERNEL(gather_4, dlp_u32, DLP_GATHER)
DLP_INDEX_KERNEL(gather_8, dlp_u64, DLP_GATHER)
DLP_INDEX_KERNEL(gather_16, dlp_w16, DLP_GATHER)

DLP_INDEX_KERNEL(scatter_1, dlp_u8, DLP_SCATTER)
DLP_INDEX_KERNEL(scatter_2, dlp_u16, DLP_SCATTER)
DLP_INDEX_KERNEL(scatter_4, dlp_u32, DLP_SCATTER)
DLP_INDEX_KERNEL(scatter_8, dlp_u64, DLP_SCATTER)
DLP_INDEX_KERNEL(scatter_16, dlp_w16, DLP_SCATTER)
