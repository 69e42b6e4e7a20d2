// When does each program of a chained decode GEMV start, get past its wait, and end?
//
// A chain of O-projection-shaped GEMVs (1024 x 2048 bf16, 4 MiB each, 64 distinct weight
// sets = 256 MiB, more than 4x L2), each `x[r] = bf16(x[r] + W[r] . a)`, 2 rows a program
// over 8 warps (the engine's default tile), the whole row requested before
// `griddepcontrol.wait`. Captured in one CUDA graph and replayed; every program stamps
// `%globaltimer` at entry, after the wait and at exit. Modes:
//   pdl    : programmatic dependent launch (launch_dependents at entry);
//   plain  : ordinary stream order (the wait is then a no-op);
//   nowts  : pdl, but the weights are loaded after the wait;
//   late   : pdl, weights first, but the next launch is let in only after the wait
//            (launch_dependents after griddepcontrol.wait), so programs start at most
//            one launch ahead.
//   cap4   : pdl, but each program reserves 56 KiB of shared memory, so at most 4
//            programs fit on an SM (512 programs: one launch fills the GPU and the next
//            one's programs start only as this one's exit), as registers do for the
//            engine's 2 x 2048 GEMV (58 registers a thread);
//   cap4l  : cap4 with the late trigger.
// Prints, over the chain's launches (medians): time per launch, how long before the
// previous launch's last exit the first program starts, how long after that exit the
// first and the last program get past their wait, and how long the post-wait part takes.
// Build: nvcc -O3 -arch=sm_90a -o pdl_timeline pdl_timeline.cu
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

constexpr int N = 1024, K = 2048, ROWS = 2, THREADS = 256, SETS = 64;

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float dot8(uint4 w, uint4 a) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float2 fw = __bfloat1622float2(w2[j]), fa = __bfloat1622float2(a2[j]);
    s += fw.x * fa.x + fw.y * fa.y;
  }
  return s;
}

// Warps 0-3 take row 0 of the program, 4-7 row 1; each lane 16 columns (two 16-byte
// loads) of its warp's 512.
__global__ void __launch_bounds__(THREADS) gemv_residual(
    const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* a, __nv_bfloat16* x,
    unsigned long long* stamps, int weights_first, int late_trigger) {
  unsigned long long t0 = now();
  if (!late_trigger) asm volatile("griddepcontrol.launch_dependents;");
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int row = blockIdx.x * ROWS + warp / 4;
  int col = (warp % 4) * 512 + lane * 16;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)row * K + col);
  uint4 w0 = make_uint4(0, 0, 0, 0), w1 = w0;
  if (weights_first) { w0 = __ldg(wr); w1 = __ldg(wr + 1); }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (late_trigger) asm volatile("griddepcontrol.launch_dependents;");
  unsigned long long t1 = now();
  if (!weights_first) { w0 = __ldg(wr); w1 = __ldg(wr + 1); }
  const uint4* ar = reinterpret_cast<const uint4*>(a + col);
  float old = __bfloat162float(x[row]);
  float s = dot8(w0, ar[0]) + dot8(w1, ar[1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  __shared__ float part[THREADS / 32];
  if (lane == 0) part[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0 || threadIdx.x == 128) {
    int base = threadIdx.x / 32;
    float sum = part[base] + part[base + 1] + part[base + 2] + part[base + 3];
    x[row] = __float2bfloat16(old + __bfloat162float(__float2bfloat16(sum)));
  }
  if (threadIdx.x == 0) {
    unsigned long long* st = stamps + 3 * blockIdx.x;
    st[0] = t0;
    st[1] = t1;
    st[2] = now();
  }
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  const int programs = N / ROWS;
  size_t wbytes = (size_t)N * K * 2;
  std::vector<__nv_bfloat16> host(N * (size_t)K);
  unsigned s = 12345;
  for (auto& v : host) {
    s = s * 1664525u + 1013904223u;
    v = __float2bfloat16(((s >> 9) / 8388608.0f - 0.5f) * 0.1f);
  }
  std::vector<__nv_bfloat16*> ws(SETS), as(SETS), xs(SETS);
  for (int i = 0; i < SETS; i++) {
    CK(cudaMalloc(&ws[i], wbytes));
    CK(cudaMemcpy(ws[i], host.data(), wbytes, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&as[i], K * 2));
    CK(cudaMemcpy(as[i], host.data() + i * K, K * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&xs[i], N * 2));
    CK(cudaMemcpy(xs[i], host.data() + i * N + 7, N * 2, cudaMemcpyHostToDevice));
  }
  unsigned long long* stamps;
  size_t nst = (size_t)SETS * programs * 3;
  CK(cudaMalloc(&stamps, nst * 8));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const char* modes[] = {"pdl", "plain", "nowts", "late", "cap4", "cap4l"};
  const int cap_bytes = 56 * 1024;
  CK(cudaFuncSetAttribute(gemv_residual, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          cap_bytes));
  int regs = 0;
  {
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, gemv_residual));
    regs = fa.numRegs;
  }
  printf("kernel: %d registers a thread\n", regs);
  printf("GEMV 1024 x 2048 bf16, %d programs of %d threads, %d launches a graph\n", programs,
         THREADS, SETS);
  printf("%-6s %9s %13s %14s %14s %11s %9s\n", "mode", "us/launch", "first start",
         "first past", "last past", "post-wait", "GB/s");
  printf("%-6s %9s %13s %14s %14s %11s %9s\n", "", "", "before prev", "wait after",
         "wait after", "(median", "");
  printf("%-6s %9s %13s %14s %14s %11s %9s\n", "", "", "end (us)", "prev end (us)",
         "prev end (us)", "program, us)", "");
  for (int m = 0; m < 6; m++) {
    bool pdl = m != 1;
    int weights_first = m != 2;
    int late_trigger = m == 3 || m == 5;
    int smem = m >= 4 ? cap_bytes : 0;
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < SETS; i++) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(programs);
      cfg.blockDim = dim3(THREADS);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = st;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = pdl ? 1 : 0;
      CK(cudaLaunchKernelEx(&cfg, gemv_residual, (const __nv_bfloat16*)ws[i],
                            (const __nv_bfloat16*)as[i], xs[i],
                            stamps + (size_t)i * programs * 3, weights_first,
                            late_trigger));
    }
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> times;
    for (int r = 0; r < 25; r++) {
      CK(cudaEventRecord(e0, st));
      CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 5) times.push_back(ms * 1000.f / SETS);
    }
    std::vector<unsigned long long> h(nst);
    CK(cudaMemcpy(h.data(), stamps, nst * 8, cudaMemcpyDeviceToHost));
    std::vector<float> early, first_wait, last_wait, post;
    for (int i = 1; i < SETS; i++) {
      const unsigned long long* p = h.data() + (size_t)(i - 1) * programs * 3;
      const unsigned long long* c = h.data() + (size_t)i * programs * 3;
      unsigned long long prev_end = 0, start = ~0ull, w_min = ~0ull, w_max = 0;
      for (int b = 0; b < programs; b++) {
        prev_end = std::max(prev_end, p[3 * b + 2]);
        start = std::min(start, c[3 * b]);
        w_min = std::min(w_min, c[3 * b + 1]);
        w_max = std::max(w_max, c[3 * b + 1]);
        post.push_back((c[3 * b + 2] - c[3 * b + 1]) / 1000.f);
      }
      early.push_back(((long long)prev_end - (long long)start) / 1000.f);
      first_wait.push_back(((long long)w_min - (long long)prev_end) / 1000.f);
      last_wait.push_back(((long long)w_max - (long long)prev_end) / 1000.f);
    }
    float us = median(times);
    printf("%-6s %9.2f %13.2f %14.2f %14.2f %11.2f %9.0f\n", modes[m], us, median(early),
           median(first_wait), median(last_wait), median(post), wbytes / us / 1000.f);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  return 0;
}
