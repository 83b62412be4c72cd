// Box copies: every job copies one strided box to another of the same shape. Packing into
// and unpacking from contiguous staging buffers are the same kernel with contiguous strides
// on one side. Stamped per word size; the host widens words where runs are aligned.
#include "common.cuh"

#define DLP_COPY_BOX(NAME, T)                                                                \
    extern "C" __global__ void __launch_bounds__(DLP_BLOCK)                                  \
        NAME(const DlpJob* __restrict__ jobs, dlp_u32 njobs, dlp_u32 ntiles) {               \
        dlp_run<T, DLP_BOX>(jobs, njobs, ntiles, 0, 0, 0);                                   \
    }

DLP_COPY_BOX(copy_box_1, dlp_u8)
DLP_COPY_BOX(copy_box_2, dlp_u16)
DLP_COPY_BOX(copy_box_4, dlp_u32)
DLP_COPY_BOX(copy_box_8, dlp_u64)
DLP_COPY_BOX(copy_box_16, dlp_w16)
