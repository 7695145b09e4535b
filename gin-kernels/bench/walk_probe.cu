// walk_probe.cu - the token-path dispatch receiver's layout (tp_recv_layout in
// src/moe/token_path_layout.cuh) timed alone.
//
// The question behind it (issue 7): inside moe_gin_dispatch at DeepSeek-V3 shape and 128 tokens
// the receivers take ~5 us from "every source's T known" to "layout done", for one token per
// thread and a handful of shared atomics. Here the same function runs on one GPU with every
// source's id list already in place (tagged for the call), so no wait, no NVLink and no other
// kernel role is involved: what is left is the code itself. Phases come from the kernel's own
// trace stamps (GIN_TRACE, cycles of the SM clock; slots as in moe_test_trace --profile).
// Checks: recvCounts (receiver 0) against a count on the host, every element; the error word.
//
// Build: gin-kernels/build --tests (or nvcc -arch=sm_90 -O3 -std=c++17 -o walk_probe walk_probe.cu)
// Run:   walk_probe [channels, default 66] [blocks, default = channels]
// Exit status: 0 = checks passed, 1 = a check failed, 2 = CUDA error or no GPU.
#define GIN4J_TRACE 1  // its own kernel, with the trace stamps of tp_recv_layout
#include "../src/moe/token_path_layout.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

static const int kDumpInts = 8192;  // per block, see the kernel's tail

static void check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    fprintf(stderr, "walk_probe.cu:%d: %s failed: %s (%s)\n", line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    exit(2);
  }
}
#define CK(x) check((x), #x, __LINE__)

__global__ void __launch_bounds__(MOE_THREADS, 1)
walk_probe_kernel(const int32_t* topkIdx, uint8_t* win, uint8_t* workspace, int32_t* recvCounts, uint32_t* errorFlags,
                  int rank, int R, int E, int K, int H, int M, int C, int T, uint64_t seq, int* dump) {
  __shared__ __align__(16) TpRecvSmem s;
  const Dims d = make_dims(rank, R, E, K, H, M, C, T);
  const MoeWindowLayout wl = moe_window_layout(d.R, d.E, d.K, d.H, d.M);
  const MoeWorkspaceLayout ws = moe_workspace_layout(d.R, d.E, d.K, d.M);
  GIN_TRACE(MOE_TRACE_DISPATCH_START);
  tp_recv_layout(s, d, (int)blockIdx.x, wl, win, workspace, ws, seq, topkIdx, recvCounts, errorFlags);
  __syncthreads();
  GIN_TRACE(MOE_TRACE_TP_RECEIVER_LAYOUT);
  // What the items read, for the host to check: [Ts, t0s, runD, maskD, slots, itemEnd (R+1),
  // nseg, segBytes] then cnt, run, mask, rowBase ([R][L] each), then hist ([R][C], block 0).
  int* o = dump + (size_t)blockIdx.x * kDumpInts;
  const int RL = d.R * d.L;
  for (int i = (int)threadIdx.x; i < d.R; i += (int)blockDim.x) {
    o[i] = s.Ts[i], o[d.R + i] = s.t0s[i], o[2 * d.R + i] = s.runD[i], o[3 * d.R + i] = (int)s.maskD[i];
    o[4 * d.R + i] = s.slots[i], o[5 * d.R + 1 + i] = s.itemEnd[i + 1], o[6 * d.R + 1 + i] = s.nseg[i];
    o[7 * d.R + 1 + i] = (int)s.segBytes[i];
  }
  if (threadIdx.x == 0) o[5 * d.R] = s.itemEnd[0];
  int* a = o + 8 * d.R + 1;
  for (int i = (int)threadIdx.x; i < RL; i += (int)blockDim.x) {
    a[i] = s.cnt[i], a[RL + i] = s.run[i], a[2 * RL + i] = (int)s.mask[i], a[3 * RL + i] = s.rowBase[i];
  }
  if (blockIdx.x == 0)
    for (int i = (int)threadIdx.x; i < d.R * d.C; i += (int)blockDim.x) a[4 * RL + i] = s.hist[i];
}

// The host's layout for receiver block c, in the kernel's dump order (docs/kernels.md, token path).
static std::vector<int> reference_layout(const std::vector<std::vector<int>>& ids, int rank, int R, int E, int K, int H,
                                         int C, int T, int c) {
  const int L = E / R, RL = R * L;
  std::vector<int> Ts(R, T), t0s(R), t1s(R), runD(R, 0), maskD(R, 0), slots(R, 0), cnt(RL, 0), run(RL, 0), mask(RL, 0);
  std::vector<int> hist(R * C, 0);
  for (int s = 0; s < R; ++s) {
    t0s[s] = (int)((int64_t)c * T / C), t1s[s] = (int)((int64_t)(c + 1) * T / C);
    for (int t = 0; t < T; ++t) {
      bool here = false;
      for (int k = 0; k < K; ++k) {
        const int e = ids[s][(size_t)t * K + k];
        bool dup = false;
        for (int j = 0; j < k; ++j) dup |= ids[s][(size_t)t * K + j] == e;
        if (dup || e < 0 || e / L != rank) continue;
        here = true;
        const int i = s * L + (e - rank * L);
        ++cnt[i];
        if (t < t0s[s]) ++run[i];
        else if (t < t1s[s]) mask[i] |= 1 << (t - t0s[s]);
      }
      if (!here) continue;
      ++slots[s];
      if (t < t0s[s]) ++runD[s];
      else if (t < t1s[s]) maskD[s] |= 1 << (t - t0s[s]);
      ++hist[s * C + (int)(((int64_t)(t + 1) * C - 1) / T)];
    }
  }
  std::vector<int> rowBase(RL);
  int start = 0;
  for (int e = 0; e < L; ++e) {
    int r = start;
    for (int s = 0; s < R; ++s) rowBase[s * L + e] = r + run[s * L + e], r += cnt[s * L + e];
    start = r;
  }
  std::vector<int> itemEnd(R + 1, 0), nseg(R), segBytes(R);
  for (int q = 0; q < R; ++q) {
    const int s = (rank + q) % R, n = __builtin_popcount((unsigned)maskD[s]);
    const RowSplit sp = row_split(2ull * H, n);  // the split rule is the kernels' own (host-callable)
    // own tokens: row_split segments; remote ones: passes of LL128 lines
    nseg[s] = q == 0 ? sp.nseg : (int)((moe_comb_lines(H) + kTpPassLines - 1) / kTpPassLines);
    segBytes[s] = (int)sp.segBytes;
    itemEnd[q + 1] = itemEnd[q] + n * nseg[s];
  }
  std::vector<int> o;
  for (auto* v : {&Ts, &t0s, &runD, &maskD, &slots}) o.insert(o.end(), v->begin(), v->end());
  o.insert(o.end(), itemEnd.begin(), itemEnd.end());
  o.insert(o.end(), nseg.begin(), nseg.end());
  o.insert(o.end(), segBytes.begin(), segBytes.end());
  for (auto* v : {&cnt, &run, &mask, &rowBase}) o.insert(o.end(), v->begin(), v->end());
  if (c == 0) o.insert(o.end(), hist.begin(), hist.end());
  return o;
}

int main(int argc, char** argv) {
  const int R = 2, E = 256, K = 8, H = 7168, M = 128, T = 128, rank = 0;
  const int C = argc > 1 ? atoi(argv[1]) : 66;
  const int blocks = argc > 2 ? atoi(argv[2]) : C;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    printf("walk_probe: SKIP: no CUDA GPU visible\n");
    return 2;
  }
  if (C < 1 || C > MOE_MAX_CHANNELS || blocks < 1 || blocks > C) {
    fprintf(stderr, "walk_probe: channels must be 1..%d and blocks 1..channels, got %d and %d\n", MOE_MAX_CHANNELS, C, blocks);
    return 2;
  }
  CK(cudaSetDevice(0));
  const int L = E / R;
  const MoeWindowLayout wl = moe_window_layout(R, E, K, H, M);
  const MoeWorkspaceLayout ws = moe_workspace_layout(R, E, K, M);
  std::mt19937_64 rng(std::random_device{}());
  // ids[src][t][k]: K distinct experts per token, uniform.
  std::vector<std::vector<int>> ids(R, std::vector<int>((size_t)T * K));
  for (int src = 0; src < R; ++src)
    for (int t = 0; t < T; ++t) {
      std::vector<int> pool(E);
      for (int e = 0; e < E; ++e) pool[e] = e;
      for (int k = 0; k < K; ++k) {
        const int j = k + (int)(rng() % (uint64_t)(E - k));
        std::swap(pool[k], pool[j]);
        ids[src][(size_t)t * K + k] = pool[k];
      }
    }
  const uint64_t seq = 1;  // the call number the receiver expects (its id lists carry it)
  std::vector<uint8_t> hwin(wl.totalBytes, 0);
  const int nw = moe_id_words(K);
  for (int src = 0; src < R; ++src) {
    if (src == rank) continue;
    uint64_t* area = (uint64_t*)(hwin.data() + wl.dispIds + ((seq & 1) * R + src) * wl.idsStride);
    area[0] = (seq << 32) | (uint32_t)T;
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < nw; ++i) {
        const uint32_t a = (uint32_t)ids[src][(size_t)t * K + 2 * i] & 0xffffu;
        const uint32_t b = 2 * i + 1 < K ? (uint32_t)ids[src][(size_t)t * K + 2 * i + 1] & 0xffffu : 0xffffu;
        area[1 + (size_t)t * nw + i] = (seq << 32) | (uint64_t)(a | (b << 16));
      }
  }
  std::vector<int> expect(L, 0);
  for (int src = 0; src < R; ++src)
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        if (ids[src][(size_t)t * K + k] / L == rank) ++expect[ids[src][(size_t)t * K + k] - rank * L];
  uint8_t *win, *workspace;
  int32_t *topk, *recvCounts;
  uint32_t* err;
  uint64_t* prof;
  const size_t profWords = GIN_TRACE_WORDS;
  CK(cudaMalloc(&win, wl.totalBytes));
  CK(cudaMalloc(&workspace, ws.totalBytes));
  CK(cudaMalloc(&topk, (size_t)T * K * 4));
  CK(cudaMalloc(&recvCounts, L * 4));
  CK(cudaMalloc(&err, 4));
  CK(cudaMalloc(&prof, profWords * 8));
  int* dump;
  CK(cudaMalloc(&dump, (size_t)blocks * kDumpInts * 4));
  std::vector<int> hd((size_t)blocks * kDumpInts);
  CK(cudaMemcpy(win, hwin.data(), wl.totalBytes, cudaMemcpyHostToDevice));
  CK(cudaMemset(workspace, 0, ws.totalBytes));
  CK(cudaMemcpy(topk, ids[rank].data(), (size_t)T * K * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(err, 0, 4));
  CK(cudaMemcpyToSymbol(gin_trace_buffer, &prof, sizeof(prof)));
  std::vector<uint64_t> h(profWords);
  const int slots[] = {MOE_TRACE_TP_WALK_CLEARED, MOE_TRACE_TP_WALK_FIRST, MOE_TRACE_TP_WALK_COUNTED,
                       MOE_TRACE_TP_WALK_DONE, MOE_TRACE_TP_RECEIVER_LAYOUT};
  const char* names[] = {"counters cleared (remote T probed)", "thread 0's first (own) tokens counted", "thread 0's tokens counted",
                         "walk barrier passed", "layout done (scan, items)"};
  std::vector<std::vector<double>> us(5);
  double ghzSum = 0;
  int bad = 0;
  const int reps = 9;
  for (int rep = 0; rep < reps; ++rep) {
    CK(cudaMemset(prof, 0, profWords * 8));
    CK(cudaMemset(recvCounts, 0xff, L * 4));  // poison
    CK(cudaMemset(dump, 0xff, (size_t)blocks * kDumpInts * 4));  // poison
    walk_probe_kernel<<<blocks, MOE_THREADS>>>(topk, win, workspace, recvCounts, err, rank, R, E, K, H, M, C, T, seq, dump);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), prof, profWords * 8, cudaMemcpyDeviceToHost));
    std::vector<int> got(L);
    uint32_t e = 0;
    CK(cudaMemcpy(got.data(), recvCounts, L * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&e, err, 4, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < L; ++i) wrong += got[i] != expect[i];
    CK(cudaMemcpy(hd.data(), dump, hd.size() * 4, cudaMemcpyDeviceToHost));
    for (int b = 0; b < blocks; ++b) {
      const std::vector<int> want = reference_layout(ids, rank, R, E, K, H, C, T, b);
      const int* g = hd.data() + (size_t)b * kDumpInts;
      int bad1 = 0;
      for (size_t i = 0; i < want.size(); ++i) bad1 += g[i] != want[i];
      if (bad1) {
        if (wrong == 0) printf("walk_probe: block %d: %d of %zu layout words differ from the host reference\n", b, bad1, want.size());
        wrong += bad1;
      }
    }
    if (wrong || e) {
      printf("walk_probe: FAILED (rep %d): %d of %d recvCounts wrong, error word 0x%x\n", rep, wrong, L, e);
      ++bad;
    }
    const size_t cyc0 = GIN_TRACE_WORDS / 2;
    auto at = [&](int b, int sl) { return h[(size_t)b * GIN_TRACE_SLOTS + sl]; };
    auto cy = [&](int b, int sl) { return h[cyc0 + (size_t)b * GIN_TRACE_SLOTS + sl]; };
    double cs = 0, ns = 0;
    for (int b = 0; b < blocks; ++b) cs += (double)(cy(b, MOE_TRACE_TP_RECEIVER_LAYOUT) - cy(b, MOE_TRACE_DISPATCH_START)),
      ns += (double)(at(b, MOE_TRACE_TP_RECEIVER_LAYOUT) - at(b, MOE_TRACE_DISPATCH_START));
    const double ghz = cs / ns;
    ghzSum += ghz;
    for (int i = 0; i < 5; ++i) {
      std::vector<double> v;
      for (int b = 0; b < blocks; ++b)
        if (at(b, slots[i])) v.push_back((double)(int64_t)(cy(b, slots[i]) - cy(b, MOE_TRACE_DISPATCH_START)) / ghz * 1e-3);
      std::sort(v.begin(), v.end());
      us[i].push_back(v.empty() ? 0.0 : v[v.size() / 2]);
    }
  }
  printf("walk_probe: DeepSeek-V3 shape (E=%d K=%d), %d tokens from each of %d sources, C=%d, %d blocks x %d threads, "
         "SM clock %.3f GHz; us after the block's start, median over blocks, then over %d launches:\n",
         E, K, T, R, C, blocks, MOE_THREADS, ghzSum / reps, reps);
  for (int i = 0; i < 5; ++i) {
    std::sort(us[i].begin(), us[i].end());
    printf("  %-28s %6.2f us (launches: min %.2f max %.2f)\n", names[i], us[i][us[i].size() / 2], us[i].front(), us[i].back());
  }
  printf("walk_probe: %s\n", bad ? "FAILED" : "recvCounts and error word checked, all passed");
  return bad ? 1 : 0;
}
