// Shared by every dlpart kernel. NVRTC has no system headers, so nothing is included here;
// the host inlines this file in place of `#include "common.cuh"` before compiling.
//
// Every kernel walks a table of jobs. A job is a strided box of at most DLP_MAX_DIMS dims,
// stored innermost dim first, with strides counted in words of the kernel's item size. The
// host collapses dims, widens the word where the innermost run is contiguous and aligned
// (a 4-byte copy becomes a 16-byte one), and splits jobs so that `numel < 2^31`: all index
// arithmetic stays 32-bit and division by a dim size is a multiply-high with a host-computed
// magic number. The layout of `DlpJob` is mirrored by `CudaJob` in src/backend/cuda/jobs.rs.
#pragma once

#define DLP_MAX_DIMS 6
#define DLP_BLOCK 256
#define DLP_UNROLL 4
#define DLP_TILE (DLP_BLOCK * DLP_UNROLL)
#define DLP_NO_AXIS 0xffffffffu

#define DLP_BOX 0
#define DLP_GATHER 1
#define DLP_SCATTER 2

typedef unsigned char dlp_u8;
typedef unsigned short dlp_u16;
typedef unsigned int dlp_u32;
typedef unsigned long long dlp_u64;
typedef long long dlp_i64;

struct DlpJob {
    dlp_u64 src;        // byte address of element (0, ..., 0) of the source box
    dlp_u64 dst;        // byte address of element (0, ..., 0) of the destination box
    dlp_u64 index;      // const dlp_i64*: coordinates along `axis` (gather/scatter), else 0
    dlp_i64 index_len;  // indices must lie in [0, index_len)
    dlp_u32 tile_start; // first tile of this job within the launch
    dlp_u32 numel;      // < 2^31
    dlp_u32 ndim;       // 1 ..= DLP_MAX_DIMS
    dlp_u32 axis;       // dim whose coordinate goes through `index`, or DLP_NO_AXIS
    dlp_u32 size[DLP_MAX_DIMS];
    dlp_u32 magic[DLP_MAX_DIMS];
    dlp_u32 shift[DLP_MAX_DIMS];
    dlp_i64 src_stride[DLP_MAX_DIMS];
    dlp_i64 dst_stride[DLP_MAX_DIMS];
};

static_assert(sizeof(DlpJob) == 216, "DlpJob must match CudaJob on the host");

// 16-byte word; the alignment lets the compiler emit ld.global.v4 / st.global.v4.
struct __align__(16) dlp_w16 {
    dlp_u64 lo, hi;
};

// n / d for n < 2^31 and 1 <= d < 2^31 (Granlund-Montgomery, as in PyTorch's IntDivider):
// magic = floor(2^32 * (2^shift - d) / d) + 1 with shift = ceil(log2 d).
__device__ __forceinline__ dlp_u32 dlp_div(dlp_u32 n, dlp_u32 magic, dlp_u32 shift) {
    return (__umulhi(n, magic) + n) >> shift;
}

template <typename T>
__device__ __forceinline__ T dlp_load(const void* base, dlp_i64 off) {
    // Sources are never written during a launch (the host guarantees disjoint boxes),
    // so the read-only data path is safe.
    return __ldg(reinterpret_cast<const T*>(base) + off);
}

template <>
__device__ __forceinline__ dlp_w16 dlp_load<dlp_w16>(const void* base, dlp_i64 off) {
    const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(base) + off);
    dlp_w16 w;
    w.lo = v.x;
    w.hi = v.y;
    return w;
}

// Stores through __stwb so that they are global stores (st.global.wb), not generic ones.
template <typename T>
__device__ __forceinline__ void dlp_store(void* base, dlp_i64 off, T v) {
    __stwb(reinterpret_cast<T*>(base) + off, v);
}

template <>
__device__ __forceinline__ void dlp_store<dlp_w16>(void* base, dlp_i64 off, dlp_w16 v) {
    ulonglong2 w;
    w.x = v.lo;
    w.y = v.hi;
    __stwb(reinterpret_cast<ulonglong2*>(base) + off, w);
}

// Records the first out-of-range index: status[0] becomes 1 and status[1] the value.
__device__ __forceinline__ void dlp_report_bad_index(dlp_u64* status, dlp_i64 value) {
    if (atomicCAS(status, 0ull, 1ull) == 0ull) {
        status[1] = (dlp_u64)value;
    }
}

// A job's geometry held in registers: reloaded only when a block moves on to another job,
// so the per-element cost is the index arithmetic alone.
struct DlpGeom {
    const void* src;
    void* dst;
    const dlp_i64* index;
    dlp_i64 index_len;
    dlp_u32 numel;
    dlp_u32 ndim;
    dlp_u32 axis;
    dlp_u32 size[DLP_MAX_DIMS];
    dlp_u32 magic[DLP_MAX_DIMS];
    dlp_u32 shift[DLP_MAX_DIMS];
    dlp_i64 src_stride[DLP_MAX_DIMS];
    dlp_i64 dst_stride[DLP_MAX_DIMS];
};

__device__ __forceinline__ void dlp_load_geom(const DlpJob* __restrict__ job, DlpGeom* g) {
    g->src = reinterpret_cast<const void*>(job->src);
    g->dst = reinterpret_cast<void*>(job->dst);
    g->index = reinterpret_cast<const dlp_i64*>(job->index);
    g->index_len = job->index_len;
    g->numel = job->numel;
    g->ndim = job->ndim;
    g->axis = job->axis;
#pragma unroll
    for (int k = 0; k < DLP_MAX_DIMS; ++k) {
        g->size[k] = job->size[k];
        g->magic[k] = job->magic[k];
        g->shift[k] = job->shift[k];
        g->src_stride[k] = job->src_stride[k];
        g->dst_stride[k] = job->dst_stride[k];
    }
}

// The hash of a winner table key (a destination slot + 1): the finaliser of MurmurHash3,
// so that runs of consecutive slots spread over the table.
__device__ __forceinline__ dlp_u64 dlp_slot_hash(dlp_u64 key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    key ^= key >> 33;
    return key;
}

// A scatter's winner for destination slot t (see scatter_winners): the address of the last
// index entry naming t. With `slots` 0 the table holds one word per slot of the axis;
// otherwise it is an open-addressing hash table of `slots` (a power of two above the number
// of indices) keys t + 1 (0: empty), followed by `slots` addresses, so that its size follows
// the number of indices and not the length of the axis. A slot not found (indices changed
// since the winner pass) has no winner: 0, which no index entry's address equals.
__device__ __forceinline__ dlp_u64 dlp_winner(const dlp_u64* __restrict__ winner, dlp_u64 slots,
                                              dlp_i64 t) {
    if (slots == 0) {
        return __ldg(winner + t);
    }
    const dlp_u64 key = (dlp_u64)t + 1;
    for (dlp_u64 h = dlp_slot_hash(key) & (slots - 1);; h = (h + 1) & (slots - 1)) {
        const dlp_u64 k = __ldg(winner + h);
        if (k == key) {
            return __ldg(winner + slots + h);
        }
        if (k == 0ull) {
            return 0ull;
        }
    }
}

// Word offsets of element `i` (C order over the job's dims) in the source and destination.
// Returns false when the element must be skipped: a bad index, or (scatter) a duplicate
// index whose later occurrence wins.
template <int MODE>
__device__ __forceinline__ bool dlp_offsets(const DlpGeom& g, dlp_u32 i,
                                            const dlp_u64* __restrict__ winner,
                                            dlp_u64 slots, dlp_u64* status, dlp_i64* src_off,
                                            dlp_i64* dst_off) {
    dlp_i64 s = 0;
    dlp_i64 d = 0;
#pragma unroll
    for (int k = 0; k < DLP_MAX_DIMS; ++k) {
        if (k >= (int)g.ndim) {
            break;
        }
        dlp_u32 c = i;
        if (k + 1 < (int)g.ndim) {
            const dlp_u32 q = dlp_div(i, g.magic[k], g.shift[k]);
            c = i - q * g.size[k];
            i = q;
        }
        dlp_i64 cs = c; // coordinate along dim k in the source
        dlp_i64 cd = c; // ... and in the destination
        if (MODE != DLP_BOX && k == (int)g.axis) {
            const dlp_i64* idx = g.index + c;
            const dlp_i64 t = __ldg(idx);
            if (t < 0 || t >= g.index_len) {
                dlp_report_bad_index(status, t);
                return false;
            }
            // Scatter: only the last position naming slot t writes it (see scatter_winners).
            if (MODE == DLP_SCATTER && dlp_winner(winner, slots, t) != (dlp_u64)idx) {
                return false;
            }
            if (MODE == DLP_GATHER) {
                cs = t;
            } else {
                cd = t;
            }
        }
        s += cs * g.src_stride[k];
        d += cd * g.dst_stride[k];
    }
    *src_off = s;
    *dst_off = d;
    return true;
}

// Grid-stride loop over the launch's tiles; each thread moves DLP_UNROLL words per tile,
// issuing all loads before any store so that several are in flight. Launch with
// blockDim.x == DLP_BLOCK.
template <typename T, int MODE>
__device__ __forceinline__ void dlp_run(const DlpJob* __restrict__ jobs, dlp_u32 njobs,
                                        dlp_u32 ntiles, const dlp_u64* __restrict__ winner,
                                        dlp_u64 slots, dlp_u64* status) {
    DlpGeom g;
    dlp_u32 job_begin = 0;
    dlp_u32 job_end = 0; // tiles [job_begin, job_end) belong to the job held in `g`
    for (dlp_u32 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        if (tile >= job_end) {
            // The last job whose first tile is <= tile (tile_start is ascending).
            dlp_u32 lo = 0;
            dlp_u32 hi = njobs - 1;
            while (lo < hi) {
                const dlp_u32 mid = (lo + hi + 1) >> 1;
                if (jobs[mid].tile_start <= tile) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            dlp_load_geom(jobs + lo, &g);
            job_begin = jobs[lo].tile_start;
            job_end = lo + 1 < njobs ? jobs[lo + 1].tile_start : ntiles;
        }
        const dlp_u32 first = (tile - job_begin) * DLP_TILE + threadIdx.x;

        T v[DLP_UNROLL];
        dlp_i64 dst_off[DLP_UNROLL];
        bool live[DLP_UNROLL];
#pragma unroll
        for (int k = 0; k < DLP_UNROLL; ++k) {
            const dlp_u32 i = first + k * DLP_BLOCK;
            dlp_i64 so = 0;
            live[k] = i < g.numel && dlp_offsets<MODE>(g, i, winner, slots, status, &so, &dst_off[k]);
            if (live[k]) {
                v[k] = dlp_load<T>(g.src, so);
            }
        }
#pragma unroll
        for (int k = 0; k < DLP_UNROLL; ++k) {
            if (live[k]) {
                dlp_store<T>(g.dst, dst_off[k], v[k]);
            }
        }
    }
}
