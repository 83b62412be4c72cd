// The kernels of kernels/*.cu built for the host, and a launcher with the driver's calling
// convention: `params[i]` points at the i-th argument, as for cuLaunchKernel. Used by the
// tests only (cargo feature `kernel-host-tests`).
#include "shim.h"

#include "copy.cu"
#include "index.cu"

extern "C" {

// A buffer the kernels may touch: [addr, addr + len).
struct DlpHostRegion {
    uint64_t addr;
    uint64_t len;
    uint32_t writable;
    uint32_t reserved;
};

// The first bad access of a launch: kind 1 misaligned, 2 outside every region, 3 a store
// into a read-only region.
struct DlpHostFault {
    uint64_t addr;
    uint32_t size;
    uint32_t kind;
};

}  // extern "C"

namespace {

struct LaunchState {
    const DlpHostRegion* regions;
    size_t nregions;
    DlpHostFault* fault;
};

thread_local LaunchState state;

void record(const void* p, size_t size, uint32_t kind) {
    if (state.fault->kind == 0) {
        state.fault->addr = (uint64_t)(uintptr_t)p;
        state.fault->size = (uint32_t)size;
        state.fault->kind = kind;
    }
}

typedef void (*Thunk)(void** params);

struct Entry {
    const char* name;
    Thunk run;
};

template <typename T>
T arg(void** params, int i) {
    return *static_cast<T*>(params[i]);
}

#define DLP_HOST_BOX(NAME)                                                                   \
    {#NAME, [](void** p) {                                                                   \
         NAME(arg<const DlpJob*>(p, 0), arg<dlp_u32>(p, 1), arg<dlp_u32>(p, 2));             \
     }}
#define DLP_HOST_INDEX(NAME)                                                                 \
    {#NAME, [](void** p) {                                                                   \
         NAME(arg<const DlpJob*>(p, 0), arg<dlp_u32>(p, 1), arg<dlp_u32>(p, 2),              \
              arg<const dlp_u64*>(p, 3), arg<dlp_u64>(p, 4), arg<dlp_u64*>(p, 5));           \
     }}
#define DLP_HOST_CHECK(NAME, U)                                                              \
    {#NAME, [](void** p) {                                                                   \
         NAME(arg<const U*>(p, 0), arg<dlp_i64>(p, 1), arg<dlp_u64>(p, 2),                   \
              arg<dlp_i64>(p, 3), arg<dlp_u32>(p, 4), arg<dlp_i64*>(p, 5),                   \
              arg<dlp_u64*>(p, 6));                                                          \
     }}

const Entry ENTRIES[] = {
    DLP_HOST_BOX(copy_box_1),
    DLP_HOST_BOX(copy_box_2),
    DLP_HOST_BOX(copy_box_4),
    DLP_HOST_BOX(copy_box_8),
    DLP_HOST_BOX(copy_box_16),
    DLP_HOST_INDEX(gather_1),
    DLP_HOST_INDEX(gather_2),
    DLP_HOST_INDEX(gather_4),
    DLP_HOST_INDEX(gather_8),
    DLP_HOST_INDEX(gather_16),
    DLP_HOST_INDEX(scatter_1),
    DLP_HOST_INDEX(scatter_2),
    DLP_HOST_INDEX(scatter_4),
    DLP_HOST_INDEX(scatter_8),
    DLP_HOST_INDEX(scatter_16),
    {"scatter_winners",
     [](void** p) {
         scatter_winners(arg<const dlp_i64*>(p, 0), arg<dlp_u64>(p, 1), arg<dlp_i64>(p, 2),
                         arg<dlp_u64*>(p, 3), arg<dlp_u64>(p, 4), arg<dlp_u64*>(p, 5));
     }},
    DLP_HOST_CHECK(check_indices_1, dlp_u8),
    DLP_HOST_CHECK(check_indices_2, dlp_u16),
    DLP_HOST_CHECK(check_indices_4, dlp_u32),
    DLP_HOST_CHECK(check_indices_8, dlp_u64),
};

const size_t NENTRIES = sizeof(ENTRIES) / sizeof(ENTRIES[0]);

bool same_name(const char* a, const char* b) {
    while (*a != 0 && *a == *b) {
        ++a;
        ++b;
    }
    return *a == *b;
}

// xorshift64*, so that a seed gives the same schedule on every machine.
struct Rng {
    uint64_t s;
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 0x2545f4914f6cdd1dull;
    }
};

// 0, 1, ..., n - 1, shuffled unless seed is 0. `out` holds n entries.
void order(unsigned* out, unsigned n, uint64_t seed) {
    for (unsigned i = 0; i < n; ++i) {
        out[i] = i;
    }
    if (seed == 0) {
        return;
    }
    Rng rng{seed};
    for (unsigned i = n; i > 1; --i) {
        const unsigned j = (unsigned)(rng.next() % i);
        const unsigned t = out[i - 1];
        out[i - 1] = out[j];
        out[j] = t;
    }
}

}  // namespace

static bool dlp_host_access(const void* p, size_t size, bool write) {
    const uint64_t a = (uint64_t)(uintptr_t)p;
    if (a % size != 0) {
        record(p, size, 1);
        return false;
    }
    if (state.nregions == 0) {
        return true;
    }
    for (size_t r = 0; r < state.nregions; ++r) {
        const DlpHostRegion& g = state.regions[r];
        if (a >= g.addr && a - g.addr <= g.len && size <= g.len - (a - g.addr)) {
            if (write && !g.writable) {
                record(p, size, 3);
                return false;
            }
            return true;
        }
    }
    record(p, size, 2);
    return false;
}

extern "C" {

// The name of the i-th kernel the host build has, or NULL past the last.
const char* dlp_host_entry(size_t i) {
    return i < NENTRIES ? ENTRIES[i].name : nullptr;
}

// Runs kernel `entry` over `grid` blocks of `block` threads, one thread at a time, blocks and
// threads in an order shuffled by `seed` (0: in order). With `nregions > 0` every global
// access must fall in one of `regions`. Returns 0, 1 when `*fault` records a bad access,
// -1 for an unknown entry, -2 for a launch shape the kernels do not support.
int dlp_host_launch(const char* entry, unsigned grid, unsigned block, void** params,
                    uint64_t seed, const DlpHostRegion* regions, size_t nregions,
                    DlpHostFault* fault) {
    const Entry* e = nullptr;
    for (size_t i = 0; i < NENTRIES; ++i) {
        if (same_name(ENTRIES[i].name, entry)) {
            e = &ENTRIES[i];
        }
    }
    if (e == nullptr) {
        return -1;
    }
    // The kernels stride by DLP_BLOCK, not blockDim.x: they must be launched with exactly it.
    if (grid == 0 || block != DLP_BLOCK) {
        return -2;
    }
    *fault = DlpHostFault{0, 0, 0};
    state = LaunchState{regions, nregions, fault};
    unsigned* blocks = new unsigned[grid];
    unsigned threads[DLP_BLOCK];
    order(blocks, grid, seed);
    gridDim = uint3{grid, 1, 1};
    blockDim = uint3{block, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx = uint3{blocks[b], 0, 0};
        order(threads, block, seed == 0 ? 0 : seed + b);
        for (unsigned t = 0; t < block; ++t) {
            threadIdx = uint3{threads[t], 0, 0};
            e->run(params);
        }
    }
    delete[] blocks;
    state = LaunchState{nullptr, 0, nullptr};
    return fault->kind == 0 ? 0 : 1;
}

}  // extern "C"
