"""Long loops over few neurons: register-pipelined prefetch (blocks of B steps of x loaded one or two blocks
ahead into registers) against the library's tuned kernels (shared-memory ring / unrolled). LIF forward,
inference (s) and forward-save (s, h), float32 and bfloat16. Kernel-only CUDA-event medians, L2 flushed, a GPU
sleep before each run so host time is excluded."""
import statistics

import torch

import autocuda.functional as F
from autocuda.ckernel import CParam
from autocuda.runtime.launch import current_stream_ptr, packed_launch

SRC = r"""
#include <cuda_bf16.h>
#define ST STORAGE
#if LANES == 1
typedef ST RAW;
__device__ __forceinline__ void unpack(RAW r, float* o) { o[0] = TOF(r); }
__device__ __forceinline__ RAW pack(const float* o) { return FROMF(o[0]); }
#else
typedef VEC RAW;
__device__ __forceinline__ void unpack(RAW r, float* o) { o[0] = TOF(r.x); o[1] = TOF(r.y); }
__device__ __forceinline__ RAW pack(const float* o) { RAW r; r.x = FROMF(o[0]); r.y = FROMF(o[1]); return r; }
#endif
extern "C" __global__ void __launch_bounds__(BLOCK) lif_regs(const long long N, const long long T,
    const ST* __restrict__ x, ST* __restrict__ s, ST* __restrict__ hs) {
  const long long n0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * LANES;
  if (n0 >= N) return;
  const RAW* xr = reinterpret_cast<const RAW*>(x + n0);
  RAW* sr = reinterpret_cast<RAW*>(s + n0);
  RAW* hr = reinterpret_cast<RAW*>(hs + n0);
  const long long row = N / LANES;
  float v[LANES];
  #pragma unroll
  for (int l = 0; l < LANES; ++l) v[l] = 0.f;
  RAW buf[AHEAD + 1][B];
  #pragma unroll
  for (int a = 0; a < AHEAD; ++a) {
    #pragma unroll
    for (int d = 0; d < B; ++d) { const long long t = a * B + d; if (t < T) buf[a][d] = xr[t * row]; }
  }
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
      }
    }
    #pragma unroll
    for (int a = 0; a < AHEAD; ++a) {
      #pragma unroll
      for (int d = 0; d < B; ++d) buf[a][d] = buf[a + 1][d];
    }
  }
}
"""
DT = {"float32": ("float", "float2", "", ""),
      "bfloat16": ("__nv_bfloat16", "__nv_bfloat162", "__bfloat162float", "__float2bfloat16_rn")}
PARAMS = (CParam("N", "long long", False, True), CParam("T", "long long", False, True),
          CParam("x", "float", True, True), CParam("s", "float", True, False), CParam("hs", "float", True, False))
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


def main():
    bw = bandwidth()
    print(f"{torch.cuda.get_device_name()} copy bandwidth {bw:.0f} GB/s")
    shapes = [(1024, 16384), (256, 65536), (2048, 8192), (512, 32768)]
    variants = [(lanes, b, a, blk) for lanes in (1, 2) for b in (16, 32) for a in (1, 2) for blk in (64, 128)]
    rows = []
    for dname in ("float32", "bfloat16"):
        dtype = getattr(torch, dname)
        st, vec, tof, fromf = DT[dname]
        for steps, n in shapes:
            x = (torch.randn(steps, n, device="cuda") * 2 + 0.5).to(dtype)
            for save in (0, 1):
                accesses = 3 if save else 2
                floor = steps * n * accesses * x.element_size() / bw / 1e6
                if save:
                    xg = x.clone().requires_grad_(True)
                    def lib(xg=xg):
                        return F.multi_step("lif", xg, final_states=False)
                    with torch.enable_grad():
                        want = lib()[0].detach().clone()
                        t_lib = median_ms(lib)
                else:
                    def lib(x=x):
                        return F.multi_step("lif", x, final_states=False)
                    with torch.no_grad():
                        want = lib()[0].clone()
                        t_lib = median_ms(lib)
                res = [("library", t_lib, True)]
                for lanes, b, ahead, blk in variants:
                    src = SRC
                    for k, val in (("STORAGE", st), ("VEC", vec), ("TOF", tof), ("FROMF", fromf), ("LANES", lanes),
                                   ("BLOCK", blk), ("AHEAD", ahead), ("SAVE", save)):
                        src = src.replace(k, str(val))
                    src = src.replace("#define B ", "")
                    src = f"#define B {b}\n" + src
                    try:
                        launch = packed_launch(src, "lif_regs", PARAMS, 0)
                    except Exception as e:
                        print("compile failed", lanes, b, ahead, blk, str(e)[:300])
                        continue
                    s, h = torch.empty_like(x), torch.empty_like(x)
                    grid = ((n // lanes + blk - 1) // blk,)
                    args = [n, steps, x.data_ptr(), s.data_ptr(), h.data_ptr()]
                    def run(launch=launch, grid=grid, blk=blk, args=args):
                        launch(grid, (blk,), args, current_stream_ptr(0))
                    run()
                    torch.cuda.synchronize()
                    same = torch.equal(s, want)
                    res.append((f"L{lanes} B{b} ahead{ahead} blk{blk}", median_ms(run), same))
                best = min(res[1:], key=lambda r: r[1])
                mode = "fs " if save else "inf"
                line = (f"{dname:8s} T={steps:5d} N={n:6d} {mode} floor {floor*1e3:6.1f} us | library "
                        f"{t_lib*1e3:6.1f} us {100*floor/t_lib:4.0f}% | best regs {best[0]:24s} {best[1]*1e3:6.1f} us "
                        f"{100*floor/best[1]:4.0f}% same={best[2]} | lib/best {t_lib/best[1]:.2f}")
                print(line, flush=True)
                rows.append((line, res))
    print("\n# all variants")
    for line, res in rows:
        print(line)
        print("   " + "  ".join(f"{name}:{t*1e3:.1f}{'' if ok else '!'}" for name, t, ok in res))


if __name__ == "__main__":
    main()
