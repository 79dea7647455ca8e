"""Micro-benchmark behind microbenchmark.txt: a hand-written LIF forward (float32, one neuron per thread, saves h)
over (T, N), as a plain loop, unrolled, and with a cp.async ring of D steps of x in shared memory. Kernel-only
CUDA-event medians with L2 flushed; every variant's outputs are checked bitwise against the first.
Run from the repository root on a GPU machine: `python3 bench/experiments/2026-11-22-h200-async-ring/cpasync.py`.
"""
import statistics

import torch

from autocuda.ckernel import CParam
from autocuda.runtime.launch import current_stream_ptr, packed_launch

SOURCE = r"""
extern "C" __global__ void lif_plain(const long long N, const long long T, const float* __restrict__ x,
    float* __restrict__ s, float* __restrict__ hs) {
  const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x; if (n >= N) return;
  float v = 0.f;
  #pragma unroll UNROLL
  for (long long t = 0; t < T; ++t) { float h = v + (x[t*N+n] - v) * 0.5f; float sp = h >= 1.f ? 1.f : 0.f;
    s[t*N+n] = sp; hs[t*N+n] = h; v = h * (1.f - sp); }
}
extern "C" __global__ void __launch_bounds__(BLOCK) lif_ring(const long long N, const long long T,
    const float* __restrict__ x, float* __restrict__ s, float* __restrict__ hs) {
  __shared__ float ring[DEPTH][BLOCK];
  const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x; if (n >= N) return;
  float v = 0.f;
  #pragma unroll
  for (int d = 0; d < DEPTH; ++d) {
    const long long t = d < T ? d : T - 1;
    unsigned a = (unsigned)__cvta_generic_to_shared(&ring[d][threadIdx.x]);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(a), "l"(x + t * N + n));
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (long long t0 = 0; t0 < T; t0 += DEPTH) {
    #pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const long long t = t0 + d;
      if (t < T) {
        asm volatile("cp.async.wait_group %0;\n" :: "n"(DEPTH - 1));
        float xv = ring[d][threadIdx.x];
        float h = v + (xv - v) * 0.5f; float sp = h >= 1.f ? 1.f : 0.f;
        s[t*N+n] = sp; hs[t*N+n] = h; v = h * (1.f - sp);
        const long long ahead = t + DEPTH < T ? t + DEPTH : T - 1;
        unsigned a = (unsigned)__cvta_generic_to_shared(&ring[d][threadIdx.x]);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(a), "l"(x + ahead * N + n));
        asm volatile("cp.async.commit_group;\n" ::);
      }
    }
  }
  asm volatile("cp.async.wait_all;\n" ::);
}
"""
PARAMS = (CParam("N", "long long", False, True), CParam("T", "long long", False, True),
          CParam("x", "float", True, True), CParam("s", "float", True, False), CParam("hs", "float", True, False))
VARIANTS = [("lif_plain", 1, 256, 1), ("lif_plain", 8, 256, 1), ("lif_ring", 1, 256, 8), ("lif_ring", 1, 256, 16),
            ("lif_ring", 1, 128, 32), ("lif_ring", 1, 64, 64), ("lif_ring", 1, 128, 16), ("lif_ring", 1, 64, 32)]
FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        FLUSH.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    a = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (median_ms(lambda: b.copy_(a)) * 1e-3) / 1e9


def main() -> None:
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth:.0f} GB/s")
    for steps, n in ((1024, 16384), (256, 65536), (64, 1 << 20)):
        x = torch.randn(steps, n, device="cuda") * 2 + 0.5
        want = None
        for name, unroll, block, depth in VARIANTS:
            source = SOURCE.replace("UNROLL", str(unroll)).replace("BLOCK", str(block)).replace("DEPTH", str(depth))
            launch = packed_launch(source, name, PARAMS, 0)
            s, h = torch.empty_like(x), torch.empty_like(x)

            grid, args = ((n + block - 1) // block,), [n, steps, x.data_ptr(), s.data_ptr(), h.data_ptr()]

            def run(launch=launch, grid=grid, block=block, args=args):
                launch(grid, (block,), args, current_stream_ptr(0))

            run()
            torch.cuda.synchronize()
            want = want or (s.clone(), h.clone())
            same = torch.equal(s, want[0]) and torch.equal(h, want[1])
            ms = median_ms(run)
            floor = steps * n * 12 / bandwidth / 1e6
            shown = depth if name == "lif_ring" else 0
            print(f"T={steps:5d} N={n:8d} {name:9s} unroll={unroll} block={block:3d} depth={shown:2d}: "
                  f"{ms:.3f} ms {100 * floor / ms:4.0f}% of floor  same={same}")


if __name__ == "__main__":
    main()
