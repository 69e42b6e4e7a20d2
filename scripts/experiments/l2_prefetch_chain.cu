// Does prefetching the next kernel's weights into L2 shorten a chain of decode GEMVs?
//
// A Qwen3-0.6B-shaped chain (28 layers of QKV 4096x1024, O 1024x2048, gate+up 6144x1024,
// down 1024x3072, plus two small weightless kernels per layer standing in for attention
// and its merge), captured in one CUDA graph with programmatic dependent launch, timed by
// graph replays (median). Modes:
//   none   : each GEMV loads its weights itself;
//   self   : each GEMV asks L2 for its own weight slice before waiting for its predecessor;
//   next   : each kernel asks L2 for the next GEMV's weights (its share) before waiting;
//   next2  : next + self.
// Every wait is pinned (see `pinned_wait`): ptxas otherwise hoists a lone
// `griddepcontrol.wait` above the loads and prefetches placed before it, as it did in
// this file's first runs, whose "changed nothing" was that artifact (docs/gpu-results.md,
// "block costs inside the step, and the paired sweep").
// Build: nvcc -O3 -arch=sm_90a -o chain l2_prefetch_chain.cu
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ void bulk_prefetch(const void* p, unsigned bytes) {
  // Both 16-byte aligned (the host guarantees it).
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes) : "memory");
}

// `griddepcontrol.wait` kept after everything issued before it: a branch on a value
// ptxas cannot know (`flag`, a kernel parameter) with a wait on either side, as the
// tilefuse sm_90 backend emits it.
__device__ __forceinline__ void pinned_wait(int flag) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.eq.s32 p, %0, 0;\n\t@p bra PW_A%=;\n\t"
      "griddepcontrol.wait;\n\tbra.uni PW_J%=;\n\tPW_A%=:\n\tgriddepcontrol.wait;\n\tPW_J%=:\n\t}"
      :: "r"(flag) : "memory");
}

// Each block prefetches its share of [pf, pf + pf_bytes), in chunks of at most 32 KiB.
__device__ __forceinline__ void prefetch_share(const char* pf, size_t pf_bytes) {
  if (pf == nullptr || threadIdx.x != 0) return;
  size_t share = (pf_bytes / gridDim.x + 15) / 16 * 16;
  size_t lo = share * blockIdx.x, hi = lo + share < pf_bytes ? lo + share : pf_bytes;
  for (size_t o = lo; o < hi; o += 32768) {
    bulk_prefetch(pf + o, (unsigned)(hi - o < 32768 ? hi - o : 32768));
  }
}

// 8 warps, one row per warp, 16-byte loads; y = bf16(0.03 * W x).
__global__ void gemv(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* x,
                     __nv_bfloat16* y, int n, int k, const char* pf, size_t pf_bytes,
                     int self_pf) {
  asm volatile("griddepcontrol.launch_dependents;");
  int row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  prefetch_share(pf, pf_bytes);
  if (self_pf && lane == 0 && row < n) bulk_prefetch(w + (size_t)row * k, k * 2);
  pinned_wait(n);
  float acc = 0.f;
  if (row < n) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)row * k);
    const uint4* xr = reinterpret_cast<const uint4*>(x);
    for (int i = lane; i < k / 8; i += 32) {
      uint4 a = wr[i], b = xr[i];
      const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
      const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float2 fa = __bfloat1622float2(a2[j]), fb = __bfloat1622float2(b2[j]);
        acc += fa.x * fb.x + fa.y * fb.y;
      }
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);
  if (lane == 0 && row < n) y[row] = __float2bfloat16(0.03f * tanhf(acc));
}

// R rows per warp, K compile-time: every weight vector of the warp's rows is loaded into
// registers before griddepcontrol.wait (so they stream during the predecessor's tail).
template <int K, int R>
__global__ void gemv_pre(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* x,
                         __nv_bfloat16* y, int n) {
  asm volatile("griddepcontrol.launch_dependents;");
  constexpr int V = K / 8 / 32;  // 16-byte vectors per lane per row
  int row0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * R, lane = threadIdx.x % 32;
  uint4 wv[R][V];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int i = 0; i < V; i++)
      wv[r][i] = row0 + r < n ? reinterpret_cast<const uint4*>(w + (size_t)(row0 + r) * K)[lane + 32 * i]
                              : make_uint4(0, 0, 0, 0);
  pinned_wait(n);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.f;
#pragma unroll
  for (int i = 0; i < V; i++) {
    uint4 b = reinterpret_cast<const uint4*>(x)[lane + 32 * i];
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int r = 0; r < R; r++) {
      const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&wv[r][i]);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float2 fa = __bfloat1622float2(a2[j]), fb = __bfloat1622float2(b2[j]);
        acc[r] += fa.x * fb.x + fa.y * fb.y;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
#pragma unroll
    for (int o = 16; o; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffff, acc[r], o);
    if (lane == 0 && row0 + r < n) y[row0 + r] = __float2bfloat16(0.03f * tanhf(acc[r]));
  }
}

template <int R>
void launch_pre(cudaStream_t s, bool pdl, int warps, const __nv_bfloat16* w, const __nv_bfloat16* x,
                __nv_bfloat16* y, int n, int k);

// A weightless kernel of `blocks` programs (stands in for attention / merge).
__global__ void small(__nv_bfloat16* v, int n, const char* pf, size_t pf_bytes) {
  asm volatile("griddepcontrol.launch_dependents;");
  prefetch_share(pf, pf_bytes);
  pinned_wait(n);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = __float2bfloat16(__bfloat162float(v[i]) * 0.5f + 0.01f);
}

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

struct Mat { __nv_bfloat16* w; int n, k; };

template <typename... A>
void launch(cudaStream_t s, bool pdl, void (*f)(A...), int grid, int block, A... args) {
  cudaLaunchConfig_t c = {};
  c.gridDim = grid; c.blockDim = block; c.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  c.attrs = at; c.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&c, f, args...));
}

template <int R>
void launch_pre(cudaStream_t s, bool pdl, int warps, const __nv_bfloat16* w, const __nv_bfloat16* x,
                __nv_bfloat16* y, int n, int k) {
  int grid = (n + warps * R - 1) / (warps * R);
  if (k == 1024) launch(s, pdl, gemv_pre<1024, R>, grid, warps * 32, w, x, y, n);
  else if (k == 2048) launch(s, pdl, gemv_pre<2048, R>, grid, warps * 32, w, x, y, n);
  else if (k == 3072) launch(s, pdl, gemv_pre<3072, R>, grid, warps * 32, w, x, y, n);
  else { fprintf(stderr, "k %d\n", k); exit(1); }
}

int main() {
  const int L = 28;
  int shapes[4][2] = {{4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}};
  std::vector<Mat> mats;
  size_t weight_bytes = 0;
  for (int l = 0; l < L; l++)
    for (auto& s : shapes) {
      Mat m{nullptr, s[0], s[1]};
      CK(cudaMalloc(&m.w, (size_t)m.n * m.k * 2));
      fill<<<1024, 256>>>(m.w, (size_t)m.n * m.k, 1234 + mats.size());
      weight_bytes += (size_t)m.n * m.k * 2;
      mats.push_back(m);
    }
  __nv_bfloat16 *bufa, *bufb, *scratch;
  CK(cudaMalloc(&bufa, 8192 * 2)); CK(cudaMalloc(&bufb, 8192 * 2)); CK(cudaMalloc(&scratch, 65536 * 2));
  fill<<<8, 256>>>(bufa, 8192, 7); fill<<<8, 256>>>(bufb, 8192, 8); fill<<<64, 256>>>(scratch, 65536, 9);
  CK(cudaDeviceSynchronize());

  // Copy ceiling: 1 GiB device-to-device, bytes read + written.
  float ceiling;
  {
    size_t nb = 1 << 30; void *a, *b; CK(cudaMalloc(&a, nb)); CK(cudaMalloc(&b, nb));
    CK(cudaMemset(a, 1, nb));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> t;
    for (int i = 0; i < 12; i++) {
      cudaEventRecord(e0); CK(cudaMemcpy(b, a, nb, cudaMemcpyDeviceToDevice)); cudaEventRecord(e1);
      cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (i >= 2) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    ceiling = 2.0 * nb / (t[t.size() / 2] * 1e-3) / 1e9;
    cudaFree(a); cudaFree(b);
  }
  printf("copy ceiling %.0f GB/s; weights %.1f MB -> floor %.1f us per chain\n", ceiling,
         weight_bytes / 1e6, weight_bytes / ceiling / 1e3);

  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const char* modes[] = {"none", "self", "next", "next+self", "next (no PDL)",
                         "pre R1 w8", "pre R2 w8", "pre R1 w4", "pre R2 w4", "pre R1 w8 (no PDL)", "pre R4 w4", "no weights (launch chain)"};
  for (int mode = 0; mode < 12; mode++) {
    bool pdl = mode != 4 && mode != 9, next = mode >= 2 && mode <= 4, self = mode == 1 || mode == 3;
    int pre_r = mode < 5 || mode == 11 ? 0 : (mode == 6 || mode == 8) ? 2 : mode == 10 ? 4 : 1;
    int pre_w = (mode == 7 || mode == 8 || mode == 10) ? 4 : 8;
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < L; l++)
      for (int j = 0; j < 4; j++) {
        int idx = l * 4 + j;
        Mat& m = mats[idx];
        const Mat* nx = idx + 1 < (int)mats.size() ? &mats[idx + 1] : nullptr;
        const char* pf = next && nx ? (const char*)nx->w : nullptr;
        size_t pfb = nx ? (size_t)nx->n * nx->k * 2 : 0;
        __nv_bfloat16* x = (j % 2 == 0) ? bufa : bufb;
        __nv_bfloat16* y = (j % 2 == 0) ? bufb : bufa;
        if (mode == 11) {
          launch(s, pdl, small, (m.n + 7) / 8, 256, scratch, 256, (const char*)nullptr, (size_t)0);
          if (j == 0) {
            launch(s, pdl, small, 64, 256, scratch, 64 * 256, (const char*)nullptr, (size_t)0);
            launch(s, pdl, small, 16, 256, scratch, 16 * 256, (const char*)nullptr, (size_t)0);
          }
        } else if (pre_r) {
          auto f = pre_r == 1 ? launch_pre<1> : pre_r == 2 ? launch_pre<2> : launch_pre<4>;
          f(s, pdl, pre_w, m.w, x, y, m.n, m.k);
          if (j == 0) {
            launch(s, pdl, small, 64, 256, scratch, 64 * 256, (const char*)nullptr, (size_t)0);
            launch(s, pdl, small, 16, 256, scratch, 16 * 256, (const char*)nullptr, (size_t)0);
          }
        } else if (j == 0) {
          // QKV, then attention (64 programs) and merge (16 programs), which prefetch O.
          launch(s, pdl, gemv, (m.n + 7) / 8, 256, (const __nv_bfloat16*)m.w, (const __nv_bfloat16*)x, y, m.n, m.k,
                 (const char*)nullptr, (size_t)0, (int)self);
          launch(s, pdl, small, 64, 256, scratch, 64 * 256, pf, pfb / 2);
          launch(s, pdl, small, 16, 256, scratch, 16 * 256, pf ? pf + pfb / 2 : pf, pfb - pfb / 2);
        } else {
          launch(s, pdl, gemv, (m.n + 7) / 8, 256, (const __nv_bfloat16*)m.w, (const __nv_bfloat16*)x, y, m.n, m.k,
                 pf, pfb, (int)self);
        }
      }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> t;
    for (int i = 0; i < 60; i++) {
      CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1); if (i >= 10) t.push_back(ms);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    float med = t[t.size() / 2] * 1e3;
    printf("%-14s chain %7.1f us  (%5.1f%% of floor; min %.1f max %.1f)\n", modes[mode], med,
           100.0 * weight_bytes / ceiling / 1e3 / med, t.front() * 1e3, t.back() * 1e3);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  }
  return 0;
}
