// Just enough of CUDA for the kernels in kernels/*.cu to compile as host C++ (see launch.cpp),
// so that tests run the real kernel source without a GPU. Never given to NVRTC.
//
// The kernels use no shared memory and no barriers: the threads of a launch talk only
// through atomics and through memory written by earlier launches. Running the threads one
// after another, in any order, is therefore one schedule the GPU could have chosen, and the
// launcher picks that order from a seed so that order-dependent results show up.
//
// Every global load and store goes through __ldg / __stwb / the atomics below, which check
// what the GPU would fault on (a misaligned word) and, when the launch names its buffers,
// what it would silently corrupt (an access outside them). The first fault is recorded and
// the access is dropped.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define __global__
#define __device__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(threads)
#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
    unsigned x, y, z;
};

// Set by the launcher for the thread it is running; thread-local because tests launch from
// several host threads at once.
static thread_local uint3 threadIdx;
static thread_local uint3 blockIdx;
static thread_local uint3 blockDim;
static thread_local uint3 gridDim;

struct __align__(16) ulonglong2 {
    unsigned long long x, y;
};

static inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}

// false when an access of `size` bytes at `p` would fault or land outside the launch's
// buffers (launch.cpp); the fault is recorded.
static bool dlp_host_access(const void* p, size_t size, bool write);

template <typename T>
static inline T __ldg(const T* p) {
    if (!dlp_host_access(p, sizeof(T), false)) {
        return T();
    }
    return *p;
}

template <typename T>
static inline void __stwb(T* p, T v) {
    if (dlp_host_access(p, sizeof(T), true)) {
        *p = v;
    }
}

static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long compare,
                                           unsigned long long value) {
    if (!dlp_host_access(p, sizeof(*p), true)) {
        return 0;
    }
    __atomic_compare_exchange_n(p, &compare, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare; // the old value, whether or not it matched
}

static inline unsigned long long atomicMax(unsigned long long* p, unsigned long long value) {
    if (!dlp_host_access(p, sizeof(*p), true)) {
        return 0;
    }
    unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < value &&
           !__atomic_compare_exchange_n(p, &old, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
