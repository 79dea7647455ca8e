// autocuda host shim: gives the CUDA built-ins our kernels use a meaning on the CPU, so the very source we
// emit for the GPU compiles with a plain C++17 compiler (g++/clang++ -I<cuda>/include). One translation
// unit = this shim, the kernel source, and a generated wrapper that runs every (block, thread) in turn.
#ifndef AUTOCUDA_HOST_SHIM_H
#define AUTOCUDA_HOST_SHIM_H

#include <cmath>
#include <cstring>

// The CUDA headers first: they bring crt/host_defines.h, which already gives __global__, __device__,
// __host__ and __forceinline__ a host meaning under g++/clang (empty / always_inline). Their half2 and
// __nv_bfloat162 arithmetic, comparisons and conversions have host definitions; the math functions
// (h2exp, ...) do not, and are supplied below.
// A unit whose kernel has no half or bfloat16 value defines AUTOCUDA_HOST_NO_HALF first (`runner.shim_for`): it takes
// CUDA's vector types alone, not the half-precision headers, which are most of a unit's compile time.
#ifndef AUTOCUDA_HOST_NO_HALF
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#else
#include <vector_types.h>
#endif

// The conversions between float and the half types are large bit-twiddling functions on the host: made calls, not
// inlined into every load and store of a kernel (a kernel's compile would spend most of its time on their copies).
// Redeclared without `static`, so whatever linkage the CUDA headers gave them is kept.
#if defined(__GNUC__) && !defined(__clang__) && !defined(AUTOCUDA_HOST_NO_HALF)
__attribute__((noinline)) __half __float2half_rn(const float a);
__attribute__((noinline)) float __half2float(const __half a);
__attribute__((noinline)) __nv_bfloat16 __float2bfloat16_rn(const float a);
__attribute__((noinline)) float __bfloat162float(const __nv_bfloat16 a);
#endif

#ifndef __global__
#define __global__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline
#endif
// host_defines.h only defines this under nvcc.
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// Built-in index variables, set by the wrapper before each simulated thread runs. thread_local because
// ctypes releases the GIL: two Python threads may run host kernels at once.
static thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;

// Threads run one after another, so a barrier cannot be honoured: refuse it at compile time.
#define __syncthreads() \
    static_assert(false, "autocuda.host cannot run __syncthreads(): host threads run one after another")

// Sequential threads make read-modify-write trivially atomic.
template <typename T> static inline T atomicAdd(T* p, T v) { const T old = *p; *p = old + v; return old; }

template <typename T> static inline T __ldg(const T* p) { return *p; }

// Fast-math intrinsics: the GPU's are approximations; the exact libm functions stand in for them. Macros,
// not functions, because glibc already declares some of these names (as aliases of expf, ...).
#define __expf expf
#define __logf logf
#define __log2f log2f
#define __log10f log10f
#define __powf powf
#define __sinf sinf
#define __cosf cosf
#define __tanf tanf
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline double __drcp_rn(double x) { return 1.0 / x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// Clamp to [0, 1]; NaN gives 0 as on the GPU (both comparisons are false).
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }

#ifndef AUTOCUDA_HOST_NO_HALF
// Packed half2 / __nv_bfloat162 math is device-only in cuda_fp16.hpp / cuda_bf16.hpp: compute each
// lane in float and round back to nearest, which is what the GPU versions approximate.
static inline float ac_host_rcpf(float x) { return 1.0f / x; }
static inline float ac_host_rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float ac_host_exp10f(float x) { return powf(10.0f, x); }
#define AC_HOST_LANEWISE(fn, f)                                                                         \
    static inline half2 fn(half2 a) {                                                                   \
        const float2 v = __half22float2(a);                                                             \
        return __floats2half2_rn(f(v.x), f(v.y));                                                       \
    }                                                                                                   \
    static inline __nv_bfloat162 fn(__nv_bfloat162 a) {                                                 \
        const float2 v = __bfloat1622float2(a);                                                         \
        return __floats2bfloat162_rn(f(v.x), f(v.y));                                                   \
    }
AC_HOST_LANEWISE(h2exp, expf)
AC_HOST_LANEWISE(h2exp2, exp2f)
AC_HOST_LANEWISE(h2exp10, ac_host_exp10f)
AC_HOST_LANEWISE(h2log, logf)
AC_HOST_LANEWISE(h2log2, log2f)
AC_HOST_LANEWISE(h2log10, log10f)
AC_HOST_LANEWISE(h2sqrt, sqrtf)
AC_HOST_LANEWISE(h2rsqrt, ac_host_rsqrtf)
AC_HOST_LANEWISE(h2rcp, ac_host_rcpf)
AC_HOST_LANEWISE(h2sin, sinf)
AC_HOST_LANEWISE(h2cos, cosf)
AC_HOST_LANEWISE(h2floor, floorf)
AC_HOST_LANEWISE(h2ceil, ceilf)
AC_HOST_LANEWISE(h2trunc, truncf)
AC_HOST_LANEWISE(h2rint, rintf)
#undef AC_HOST_LANEWISE
#endif

// Launch arguments arrive as an array of pointers to packed values (pointers as 64-bit addresses, scalars
// in their declared width). A slot converts to whatever type the wrapper declares, so the declaration
// (from the kernel's parameter list) alone decides how the bytes are read; memcpy avoids aliasing and
// alignment trouble.
struct ac_host_slot {
    const void* bytes;
    template <typename T> operator T() const {
        static_assert(sizeof(T) <= 8, "launch arguments are at most 8 bytes");
        T value;
        std::memcpy(&value, bytes, sizeof value);
        return value;
    }
};

#define AC_HOST_EXPORT __attribute__((visibility("default")))

#endif  // AUTOCUDA_HOST_SHIM_H
