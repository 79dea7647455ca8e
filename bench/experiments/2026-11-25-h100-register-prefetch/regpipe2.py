"""Register pipelines, second sweep: lanes x steps per block (B) x blocks ahead, forward (inf, fs) and a
LIF-like backward (reverse loop over grad_s and h, writing grad_x), float32 and bfloat16, against the library."""
import statistics

import torch

import autocuda.functional as F
from autocuda.ckernel import CParam
from autocuda.runtime.launch import current_stream_ptr, packed_launch

COMMON = r"""
#include <cuda_bf16.h>
#define ST STORAGE
struct __align__(ALIGN) RAW { ST e[LANES]; };
__device__ __forceinline__ void unpack(RAW r, float* o) {
  #pragma unroll
  for (int l = 0; l < LANES; ++l) o[l] = TOF(r.e[l]); }
__device__ __forceinline__ RAW pack(const float* o) { RAW r;
  #pragma unroll
  for (int l = 0; l < LANES; ++l) r.e[l] = FROMF(o[l]); return r; }
"""
FWD = COMMON + r"""
extern "C" __global__ void __launch_bounds__(64) k(const long long N, const long long T,
    const ST* __restrict__ x, ST* __restrict__ s, ST* __restrict__ hs, ST* __restrict__ unused) {
  const long long n0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * LANES;
  if (n0 >= N) return;
  const RAW* xr = reinterpret_cast<const RAW*>(x + n0);
  RAW* sr = reinterpret_cast<RAW*>(s + n0); RAW* hr = reinterpret_cast<RAW*>(hs + n0);
  const long long row = N / LANES;
  float v[LANES];
  #pragma unroll
  for (int l = 0; l < LANES; ++l) v[l] = 0.f;
  RAW buf[AHEAD + 1][B];
  #pragma unroll
  for (int a = 0; a < AHEAD; ++a) {
    #pragma unroll
    for (int d = 0; d < B; ++d) { const long long t = a * B + d; if (t < T) buf[a][d] = xr[t * row]; } }
  for (long long t0 = 0; t0 < T; t0 += B) {
    #pragma unroll
    for (int d = 0; d < B; ++d) { const long long t = t0 + AHEAD * B + d; if (t < T) buf[AHEAD][d] = xr[t * row]; }
    #pragma unroll
    for (int d = 0; d < B; ++d) {
      const long long t = t0 + d;
      if (t < T) {
        float xv[LANES], sp[LANES], h[LANES];
        unpack(buf[0][d], xv);
        #pragma unroll
        for (int l = 0; l < LANES; ++l) { h[l] = v[l] + (xv[l] - v[l]) * 0.5f; sp[l] = h[l] >= 1.f ? 1.f : 0.f;
          v[l] = h[l] * (1.f - sp[l]); }
        sr[t * row] = pack(sp);
#if SAVE
        hr[t * row] = pack(h);
#endif
      } }
    #pragma unroll
    for (int a = 0; a < AHEAD; ++a) {
      #pragma unroll
      for (int d = 0; d < B; ++d) buf[a][d] = buf[a + 1][d]; }
  }
}
"""
BWD = COMMON + r"""
extern "C" __global__ void __launch_bounds__(64) k(const long long N, const long long T,
    const ST* __restrict__ gs, const ST* __restrict__ hs, ST* __restrict__ gx, ST* __restrict__ unused) {
  const long long n0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * LANES;
  if (n0 >= N) return;
  const RAW* gr = reinterpret_cast<const RAW*>(gs + n0); const RAW* hr = reinterpret_cast<const RAW*>(hs + n0);
  RAW* xr = reinterpret_cast<RAW*>(gx + n0);
  const long long row = N / LANES;
  float g[LANES];
  #pragma unroll
  for (int l = 0; l < LANES; ++l) g[l] = 0.f;
  RAW bg[AHEAD + 1][B], bh[AHEAD + 1][B];
  #pragma unroll
  for (int a = 0; a < AHEAD; ++a) {
    #pragma unroll
    for (int d = 0; d < B; ++d) { const long long t = T - 1 - (a * B + d);
      if (t >= 0) { bg[a][d] = gr[t * row]; bh[a][d] = hr[t * row]; } } }
  for (long long t0 = T - 1; t0 >= 0; t0 -= B) {
    #pragma unroll
    for (int d = 0; d < B; ++d) { const long long t = t0 - (AHEAD * B + d);
      if (t >= 0) { bg[AHEAD][d] = gr[t * row]; bh[AHEAD][d] = hr[t * row]; } }
    #pragma unroll
    for (int d = 0; d < B; ++d) {
      const long long t = t0 - d;
      if (t >= 0) {
        float gv[LANES], h[LANES], out[LANES];
        unpack(bg[0][d], gv); unpack(bh[0][d], h);
        #pragma unroll
        for (int l = 0; l < LANES; ++l) { const float z = h[l] - 1.f; const float sg = 1.f / (1.f + 4.f * z * z);
          const float s = h[l] >= 1.f ? 1.f : 0.f; const float gh = gv[l] * sg + g[l] * (1.f - s);
          out[l] = gh * 0.5f; g[l] = gh * 0.5f; }
        xr[t * row] = pack(out);
      } }
    #pragma unroll
    for (int a = 0; a < AHEAD; ++a) {
      #pragma unroll
      for (int d = 0; d < B; ++d) { bg[a][d] = bg[a + 1][d]; bh[a][d] = bh[a + 1][d]; } }
  }
}
"""
DT = {"float32": ("float", "", ""), "bfloat16": ("__nv_bfloat16", "__bfloat162float", "__float2bfloat16_rn")}
PARAMS = (CParam("N", "long long", False, True), CParam("T", "long long", False, True),
          CParam("a", "float", True, True), CParam("b", "float", True, False), CParam("c", "float", True, False),
          CParam("d", "float", True, False))
FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def median_ms(fn, reps=15):
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        FLUSH.zero_()
        torch.cuda._sleep(1_000_000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def bandwidth():
    a = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (median_ms(lambda: b.copy_(a)) * 1e-3) / 1e9


def library(mode, x):
    if mode == "inf":
        with torch.no_grad():
            return median_ms(lambda: F.multi_step("lif", x, final_states=False))
    xg = x.clone().requires_grad_(True)
    with torch.enable_grad():
        if mode == "fs":
            return median_ms(lambda: F.multi_step("lif", xg, final_states=False))
        s = F.multi_step("lif", xg, final_states=False)[0]
        g = torch.randn_like(s)
        return median_ms(lambda: torch.autograd.grad(s, xg, g, retain_graph=True))


def main():
    bw = bandwidth()
    print(f"{torch.cuda.get_device_name()} copy bandwidth {bw:.0f} GB/s")
    summary = []
    for dname, lanes_set in (("bfloat16", (2, 4)), ("float32", (1, 2))):
        dtype = getattr(torch, dname)
        st, tof, fromf = DT[dname]
        for steps, n in ((1024, 16384), (2048, 8192), (256, 65536)):
            x = (torch.randn(steps, n, device="cuda") * 2 + 0.5).to(dtype)
            h = (torch.randn(steps, n, device="cuda") + 1).to(dtype)
            for mode in ("inf", "fs", "bwd"):
                accesses = {"inf": 2, "fs": 3, "bwd": 3}[mode]
                floor = steps * n * accesses * x.element_size() / bw / 1e6
                t_lib = library(mode, x)
                res = []
                for lanes in lanes_set:
                    for b in (16, 32, 64):
                        for ahead in (1, 2, 3):
                            words = (ahead + 1) * b * lanes * x.element_size() // 4 * (2 if mode == "bwd" else 1)
                            if words > 128:
                                continue
                            src = (BWD if mode == "bwd" else FWD)
                            for kk, val in (("STORAGE", st), ("TOF", tof), ("FROMF", fromf), ("LANES", lanes),
                                            ("ALIGN", lanes * x.element_size()), ("AHEAD", ahead),
                                            ("SAVE", int(mode == "fs"))):
                                src = src.replace(kk, str(val))
                            src = f"#define B {b}\n" + src
                            launch = packed_launch(src, "k", PARAMS, 0)
                            outs = [torch.empty_like(x) for _ in range(3)]
                            args = [n, steps, x.data_ptr(), *[o.data_ptr() for o in outs]]
                            if mode == "bwd":
                                args = [n, steps, x.data_ptr(), h.data_ptr(), outs[0].data_ptr(), 0]
                            grid = ((n // lanes + 63) // 64,)
                            def run(launch=launch, grid=grid, args=args):
                                launch(grid, (64,), args, current_stream_ptr(0))
                            res.append((f"L{lanes} B{b} a{ahead}", median_ms(run)))
                best = min(res, key=lambda r: r[1])
                line = (f"{dname:8s} T={steps:5d} N={n:6d} {mode} floor {floor*1e3:5.1f} | library {t_lib*1e3:6.1f} us "
                        f"{100*floor/t_lib:3.0f}% | best {best[0]:12s} {best[1]*1e3:6.1f} us {100*floor/best[1]:3.0f}% "
                        f"| lib/best {t_lib/best[1]:.2f}")
                print(line, flush=True)
                print("    " + "  ".join(f"{nm}:{t*1e3:.1f}" for nm, t in res), flush=True)
                summary.append(line)
    print("\n".join(["", "# summary"] + summary))


if __name__ == "__main__":
    main()
