"""Micro-benchmark: LIF forward (fp32, one neuron per thread) over (T, N): plain loop, unrolled, and a cp.async
ring of D steps in shared memory. Kernel-only CUDA-event medians, L2 flushed."""
import statistics, torch
from autocuda.runtime.launch import packed_launch, current_stream_ptr
from autocuda.ckernel import CParam

SRC = r'''
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
  __shared__ float ring[D][BLOCK];
  const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x; if (n >= N) return;
  float v = 0.f;
  #pragma unroll
  for (int d = 0; d < D; ++d) {
    const long long t = d < T ? d : T - 1;
    unsigned a = (unsigned)__cvta_generic_to_shared(&ring[d][threadIdx.x]);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(a), "l"(x + t * N + n));
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (long long t0 = 0; t0 < T; t0 += D) {
    #pragma unroll
    for (int d = 0; d < D; ++d) {
      const long long t = t0 + d;
      if (t < T) {
        asm volatile("cp.async.wait_group %0;\n" :: "n"(D - 1));
        float xv = ring[d][threadIdx.x];
        float h = v + (xv - v) * 0.5f; float sp = h >= 1.f ? 1.f : 0.f;
        s[t*N+n] = sp; hs[t*N+n] = h; v = h * (1.f - sp);
        const long long ta = t + D < T ? t + D : T - 1;
        unsigned a = (unsigned)__cvta_generic_to_shared(&ring[d][threadIdx.x]);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(a), "l"(x + ta * N + n));
        asm volatile("cp.async.commit_group;\n" ::);
      }
    }
  }
  asm volatile("cp.async.wait_all;\n" ::);
}
'''
P = [CParam("N", "long long", False, True), CParam("T", "long long", False, True), CParam("x", "float", True, True),
     CParam("s", "float", True, False), CParam("hs", "float", True, False)]
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
def timeit(fn, reps=20):
    for _ in range(3): fn()
    ts = []
    for _ in range(reps):
        flush.zero_(); a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)
a = torch.empty(512 << 20, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
bw = 2 * a.numel() / (timeit(lambda: b.copy_(a)) * 1e-3) / 1e9; del a, b
print(f"copy bandwidth {bw:.0f} GB/s")
for T, N in ((1024, 16384), (256, 65536), (64, 1 << 20)):
    x = torch.randn(T, N, device="cuda") * 2 + 0.5
    want = None
    for name, unroll, block, depth in [("lif_plain", 1, 256, 0), ("lif_plain", 8, 256, 0),
                                       ("lif_ring", 1, 256, 8), ("lif_ring", 1, 256, 16), ("lif_ring", 1, 128, 32),
                                       ("lif_ring", 1, 64, 64), ("lif_ring", 1, 128, 16), ("lif_ring", 1, 64, 32)]:
        src = SRC.replace("UNROLL", str(unroll)).replace("BLOCK", str(block)).replace("D - 1", str(max(depth, 1) - 1)).replace("[D]", f"[{max(depth,1)}]").replace("d < D", f"d < {max(depth,1)}").replace("t0 += D", f"t0 += {max(depth,1)}").replace("t + D", f"t + {max(depth,1)}")
        launch = packed_launch(src, name, tuple(P), 0)
        s, h = torch.empty_like(x), torch.empty_like(x)
        run = lambda: launch(((N + block - 1) // block,), (block,), [N, T, x.data_ptr(), s.data_ptr(), h.data_ptr()], current_stream_ptr(0))
        run(); torch.cuda.synchronize()
        if want is None: want = (s.clone(), h.clone())
        ok = torch.equal(s, want[0]) and torch.equal(h, want[1])
        ms = timeit(run)
        floor = T * N * 12 / bw / 1e6
        print(f"T={T:5d} N={N:8d} {name:9s} unroll={unroll} block={block:3d} depth={depth:2d}: {ms:.3f} ms {100*floor/ms:4.0f}% of floor  same={ok}")
