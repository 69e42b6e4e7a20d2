// Can one persistent kernel with grid-wide barriers beat a kernel-per-GEMV chain?
//
// The same Qwen3-0.6B-shaped GEMV chain as l2_prefetch_chain.cu (28 layers of QKV
// 4096x1024, O 1024x2048, gate+up 6144x1024, down 1024x3072; y = bf16(0.03 tanh(W x)),
// each GEMV's input the previous one's output), run four ways, each captured in a CUDA
// graph and timed by replays (median of 20 after 3 warm-ups):
//   chain      : one kernel per GEMV, 8 warps, one row per warp, programmatic launch;
//   direct     : one persistent kernel (one program per SM), a grid barrier between
//                GEMVs, each program loading its rows' weights after the barrier;
//   staged     : the same, but each program streams the weights of its rows for the
//                next GEMV into shared memory (bulk async copies, double buffered)
//                while it computes this one and waits at the barrier;
//   staged+2   : staged, plus two empty barrier phases per layer (where attention and
//                its merge would go: 168 barriers per step, as the decode step has).
// The floor is the weight bytes over the copy ceiling measured in the same run. Every
// mode's final output is compared with the chain's (they must agree bit for bit).
// Bounds, not decoders: staged / direct without barriers (wrong results: programs read
// inputs not yet written), and the barriers alone.
// Build: nvcc -O3 -arch=sm_90a -o persistent persistent_chain.cu
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

constexpr int L = 28, MATS = 4 * L, THREADS = 512, WARPS = THREADS / 32;
constexpr int MAX_X = 6144;              // longest GEMV input/output
constexpr int STAGE_BYTES = 96 * 1024;   // one GEMV's weights per program, at most

struct Mat { const __nv_bfloat16* w; int n, k; };
struct Chain { Mat m[MATS]; };

__device__ __forceinline__ float act(float acc) { return 0.03f * tanhf(acc); }

// ---- the chain: one kernel per GEMV ------------------------------------------------
__global__ void gemv(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* x,
                     __nv_bfloat16* y, int n, int k) {
  asm volatile("griddepcontrol.launch_dependents;");
  int row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  asm volatile("griddepcontrol.wait;" ::: "memory");
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
  if (lane == 0 && row < n) y[row] = __float2bfloat16(act(acc));
}

// ---- persistent helpers -------------------------------------------------------------
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Every program arrives once per phase; `target` = programs x phases so far.
__device__ __forceinline__ void grid_barrier(unsigned* ctr, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(ctr, 1u);
    while (ld_acquire(ctr) < target) {}
  }
  __syncthreads();
}
__device__ __forceinline__ void mbar_init(uint64_t* b) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(b)));
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_addr(b)), "r"(parity) : "memory");
  }
}
// Thread 0: copy `bytes` (multiple of 16) from global to shared, completing on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
  for (unsigned o = 0; o < bytes; o += 32768) {
    unsigned sz = bytes - o < 32768 ? bytes - o : 32768;
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_addr((char*)dst + o)), "l"((const char*)src + o), "r"(sz), "r"(smem_addr(bar))
                 : "memory");
  }
}
__device__ __forceinline__ void rows_of(int n, int& lo, int& hi) {
  lo = (int)((long long)n * blockIdx.x / gridDim.x);
  hi = (int)((long long)n * (blockIdx.x + 1) / gridDim.x);
}

// One GEMV phase for this program's rows, weights from `wsrc` (global or shared, rows
// lo.. contiguous), the input already in shared memory `xs`.
__device__ __forceinline__ void rows_gemv(const __nv_bfloat16* wsrc, const __nv_bfloat16* xs,
                                          __nv_bfloat16* y, int lo, int hi, int k) {
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = lo + warp; r < hi; r += WARPS) {
    const uint4* wr = reinterpret_cast<const uint4*>(wsrc + (size_t)(r - lo) * k);
    const uint4* xr = reinterpret_cast<const uint4*>(xs);
    float acc = 0.f;
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
#pragma unroll
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);
    if (lane == 0) y[r] = __float2bfloat16(act(acc));
  }
}

// The input vector into shared memory, through L2 (another program wrote it).
__device__ __forceinline__ void load_x(const __nv_bfloat16* x, __nv_bfloat16* xs, int k) {
  for (int i = threadIdx.x; i < k / 8; i += THREADS)
    reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(x) + i);
  __syncthreads();
}

// staged = 0: weights read from global after each barrier; 1: streamed into shared
// memory one GEMV ahead. extra: empty barrier phases after each layer's QKV and O.
__global__ void __launch_bounds__(THREADS, 1)
persistent(Chain c, __nv_bfloat16* bufa, __nv_bfloat16* bufb, unsigned* ctr, int staged, int extra,
           int barriers, int work) {
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* stage[2] = {(__nv_bfloat16*)smem, (__nv_bfloat16*)(smem + STAGE_BYTES)};
  __nv_bfloat16* xs = (__nv_bfloat16*)(smem + 2 * STAGE_BYTES);
  __shared__ __align__(8) uint64_t bars[2];
  if (threadIdx.x == 0) {
    mbar_init(&bars[0]); mbar_init(&bars[1]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int p) {
    if (p >= MATS || threadIdx.x != 0) return;
    int lo, hi; rows_of(c.m[p].n, lo, hi);
    unsigned bytes = (unsigned)(hi - lo) * c.m[p].k * 2;
    if (bytes) bulk_load(stage[p % 2], c.m[p].w + (size_t)lo * c.m[p].k, bytes, &bars[p % 2]);
    else asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_addr(&bars[p % 2])) : "memory");
  };
  if (staged) { issue(0); issue(1); }
  unsigned phases = 0;
  for (int p = 0; p < MATS; p++) {
    const Mat m = c.m[p];
    const __nv_bfloat16* x = (p % 2 == 0) ? bufa : bufb;
    __nv_bfloat16* y = (p % 2 == 0) ? bufb : bufa;
    int lo, hi; rows_of(m.n, lo, hi);
    if (!work) {
      // Barriers only.
    } else if (staged) {
      load_x(x, xs, m.k);
      mbar_wait(&bars[p % 2], (p / 2) & 1);
      rows_gemv(stage[p % 2], xs, y, lo, hi, m.k);
      __syncthreads();  // everyone is done with this buffer ...
      if (threadIdx.x == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(p + 2);     // ... so it takes the weights two GEMVs ahead
    } else {
      load_x(x, xs, m.k);
      rows_gemv(m.w + (size_t)lo * m.k, xs, y, lo, hi, m.k);
    }
    if (barriers) {
      grid_barrier(ctr, ++phases * gridDim.x);
      if (extra && (p % 4 == 0 || p % 4 == 1)) grid_barrier(ctr, ++phases * gridDim.x);
    } else {
      __syncthreads();
    }
  }
}

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

int main() {
  int shapes[4][2] = {{4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}};
  Chain chain;
  size_t weight_bytes = 0;
  for (int i = 0; i < MATS; i++) {
    int n = shapes[i % 4][0], k = shapes[i % 4][1];
    __nv_bfloat16* w; CK(cudaMalloc(&w, (size_t)n * k * 2));
    fill<<<1024, 256>>>(w, (size_t)n * k, 1234 + i);
    chain.m[i] = {w, n, k};
    weight_bytes += (size_t)n * k * 2;
  }
  __nv_bfloat16 *x0, *bufa, *bufb; unsigned* ctr;
  CK(cudaMalloc(&x0, MAX_X * 2)); CK(cudaMalloc(&bufa, MAX_X * 2)); CK(cudaMalloc(&bufb, MAX_X * 2));
  CK(cudaMalloc(&ctr, 4));
  fill<<<8, 256>>>(x0, MAX_X, 7);
  CK(cudaDeviceSynchronize());

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
  float floor_us = weight_bytes / ceiling / 1e3;
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t smem = 2 * STAGE_BYTES + MAX_X * 2;
  CK(cudaFuncSetAttribute(persistent, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  printf("copy ceiling %.0f GB/s; weights %.1f MB -> floor %.1f us; %d SMs, %zu B shared per program\n",
         ceiling, weight_bytes / 1e6, floor_us, sms, smem);

  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const char* names[] = {"chain (PDL)", "persistent, direct loads", "persistent, staged",
                         "persistent, staged, +2 barriers/layer", "staged, no barriers (wrong result)",
                         "barriers only (112)", "direct, no barriers (wrong result)"};
  std::vector<uint16_t> ref(MAX_X), out(MAX_X);
  for (int mode = 0; mode < 7; mode++) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(bufa, x0, MAX_X * 2, cudaMemcpyDeviceToDevice, s));
    if (mode == 0) {
      for (int p = 0; p < MATS; p++) {
        cudaLaunchConfig_t lc = {};
        lc.gridDim = (chain.m[p].n + 7) / 8; lc.blockDim = 256; lc.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        lc.attrs = at; lc.numAttrs = p == 0 ? 0 : 1;
        const __nv_bfloat16* x = (p % 2 == 0) ? bufa : bufb;
        __nv_bfloat16* y = (p % 2 == 0) ? bufb : bufa;
        CK(cudaLaunchKernelEx(&lc, gemv, chain.m[p].w, x, y, chain.m[p].n, chain.m[p].k));
      }
    } else {
      CK(cudaMemsetAsync(ctr, 0, 4, s));
      persistent<<<sms, THREADS, smem, s>>>(chain, bufa, bufb, ctr, mode == 2 || mode == 3 || mode == 4,
                                            mode == 3, mode != 4 && mode != 6, mode != 5);
      CK(cudaGetLastError());
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> t;
    for (int i = 0; i < 23; i++) {
      CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms; cudaEventElapsedTime(&ms, e0, e1); if (i >= 3) t.push_back(ms * 1e3f);
    }
    std::sort(t.begin(), t.end());
    // MATS is even: the last GEMV (n = 1024) writes bufa.
    CK(cudaMemcpy(out.data(), bufa, 1024 * 2, cudaMemcpyDeviceToHost));
    if (mode == 0) ref = out;
    bool same = memcmp(ref.data(), out.data(), 1024 * 2) == 0;
    printf("%-40s %8.1f us  (p10 %.1f, p90 %.1f)  %5.1f%% of floor  %s\n", names[mode],
           t[t.size() / 2], t[t.size() / 10], t[t.size() * 9 / 10], 100.f * floor_us / t[t.size() / 2],
           same ? "output = chain's" : "OUTPUT DIFFERS");
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  }
  return 0;
}
