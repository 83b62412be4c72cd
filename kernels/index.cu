// Gather and scatter along one axis with int64 indices. A job is an (outer, index, inner)
// box whose `axis` dim takes its source (gather) or destination (scatter) coordinate from
// the index array; contiguous inner runs are widened by the host like box copies.
#include "common.cuh"

// For every destination slot t, the address of the last index entry naming t: address order
// is position order, and an address stays unique when the host splits the index array
// across jobs. `winner` must be zeroed first. Scatter then lets only that entry write, so
// later duplicates win deterministically.
extern "C" __global__ void __launch_bounds__(DLP_BLOCK)
    scatter_winners(const dlp_i64* __restrict__ index, dlp_u64 n, dlp_i64 len,
                    dlp_u64* winner, dlp_u64* status) {
    const dlp_u64 stride = (dlp_u64)gridDim.x * DLP_BLOCK;
    for (dlp_u64 p = (dlp_u64)blockIdx.x * DLP_BLOCK + threadIdx.x; p < n; p += stride) {
        const dlp_i64 t = __ldg(index + p);
        if (t < 0 || t >= len) {
            dlp_report_bad_index(status, t);
        } else {
            atomicMax(winner + t, (dlp_u64)(index + p));
        }
    }
}

#define DLP_INDEX_KERNEL(NAME, T, MODE)                                                      \
    extern "C" __global__ void __launch_bounds__(DLP_BLOCK)                                  \
        NAME(const DlpJob* __restrict__ jobs, dlp_u32 njobs, dlp_u32 ntiles,                 \
             const dlp_u64* __restrict__ winner, dlp_u64* status) {                          \
        dlp_run<T, MODE>(jobs, njobs, ntiles, winner, status);                               \
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
