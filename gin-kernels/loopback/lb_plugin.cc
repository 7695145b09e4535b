// lb_plugin.cc - NCCL GIN plugin (ncclGinPlugin_v12, NCCL 2.29) over the loopback transport core
// (lb_core.h): a "proxy" GIN device, so NCCL's proxy thread hands the GPU's put descriptors to
// iput / iputSignal here, and the bytes move between the processes of this machine through
// shared-memory rings, copied with the CUDA driver. A TEST TRANSPORT for hosts without an RDMA
// device: used only where NCCL_GIN_PLUGIN names this library; its timings say nothing about a
// real network. Built against the plugin headers of NCCL's own source (gin-kernels/loopback/build).
//
// Only this file knows NCCL's plugin table: a wrapper for another interface version (for example
// NCCL >= 2.30's ncclRmaPlugin_v14) is a second file of this kind over the same core.
#include "lb_core.h"

#include <cuda.h>
#include <dlfcn.h>
#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_gin.h"
#include "nccl_device/gin/proxy/gin_proxy_device_host_common.h"  // NCCL_GIN_PROXY_VERSION

namespace {

ncclDebugLogger_t g_nccl_log = nullptr;

void to_nccl_log(int level, const char* msg) {
  if (g_nccl_log) {
    g_nccl_log(level <= 1 ? NCCL_LOG_WARN : NCCL_LOG_INFO, NCCL_INIT | NCCL_NET, __FILE__, __LINE__, "GIN/gin4j-loopback: %s", msg);
  } else {
    fprintf(stderr, "GIN/gin4j-loopback: %s\n", msg);
  }
}

void log_at(int level, const char* fmt, va_list ap) {
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  to_nccl_log(level, buf);
}
void info(const char* fmt, ...) { va_list ap; va_start(ap, fmt); log_at(2, fmt, ap); va_end(ap); }
void warn(const char* fmt, ...) { va_list ap; va_start(ap, fmt); log_at(0, fmt, ap); va_end(ap); }

ncclResult_t to_nccl(int e) {
  switch (e) {
    case LB_OK: return ncclSuccess;
    case LB_EINVAL: return ncclInvalidUsage;
    case LB_EPEER: return ncclRemoteError;
    default: return ncclSystemError;
  }
}

// The driver functions used here, from libcuda.so.1 at run time (no link-time libcuda needed;
// cuda.h's macros name the versioned symbols, e.g. cuMemcpyDtoHAsync -> cuMemcpyDtoHAsync_v2).
struct Driver {
  decltype(&::cuGetErrorName) getErrorName;
  decltype(&::cuCtxGetCurrent) ctxGetCurrent;
  decltype(&::cuCtxSetCurrent) ctxSetCurrent;
  decltype(&::cuStreamCreate) streamCreate;
  decltype(&::cuStreamDestroy) streamDestroy;
  decltype(&::cuStreamSynchronize) streamSynchronize;
  decltype(&::cuMemcpyDtoHAsync) memcpyDtoHAsync;
  decltype(&::cuMemcpyHtoDAsync) memcpyHtoDAsync;
  decltype(&::cuMemHostRegister) memHostRegister;
  decltype(&::cuMemHostUnregister) memHostUnregister;
};
Driver cu;
bool g_driver_ok = false;
std::once_flag g_driver_once;

#define STR2(x) #x
#define STR(x) STR2(x)
bool load_driver() {
  std::call_once(g_driver_once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { warn("cannot load the CUDA driver (libcuda.so.1): %s", dlerror()); return; }
    bool ok = true;
#define LOAD(field, fn) do { *(void**)&cu.field = dlsym(lib, STR(fn)); if (!cu.field) { warn("libcuda.so.1 has no %s", STR(fn)); ok = false; } } while (0)
    LOAD(getErrorName, cuGetErrorName);
    LOAD(ctxGetCurrent, cuCtxGetCurrent);
    LOAD(ctxSetCurrent, cuCtxSetCurrent);
    LOAD(streamCreate, cuStreamCreate);
    LOAD(streamDestroy, cuStreamDestroy);
    LOAD(streamSynchronize, cuStreamSynchronize);
    LOAD(memcpyDtoHAsync, cuMemcpyDtoHAsync);
    LOAD(memcpyHtoDAsync, cuMemcpyHtoDAsync);
    LOAD(memHostRegister, cuMemHostRegister);
    LOAD(memHostUnregister, cuMemHostUnregister);
#undef LOAD
    g_driver_ok = ok;
  });
  return g_driver_ok;
}

struct Cuda {
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  uint64_t signalWord = 0;  // a signal's value on its way through the host
};

int cu_check(CUresult r, const char* what) {
  lb_note_op(nullptr);
  if (r == CUDA_SUCCESS) return LB_OK;
  const char* name = nullptr;
  cu.getErrorName(r, &name);
  warn("%s failed: %s (%d)", what, name ? name : "unknown CUresult", (int)r);
  return LB_ESYS;
}

// NCCL's proxy thread has no CUDA context of its own: use the one connect ran under.
int bind(Cuda* k) {
  CUcontext cur = nullptr;
  if (cu.ctxGetCurrent(&cur) == CUDA_SUCCESS && cur == k->ctx) return LB_OK;
  return cu_check(cu.ctxSetCurrent(k->ctx), "cuCtxSetCurrent");
}

int cuda_to_ring(void* ctx, void* ring, const void* src, int kind, size_t n) {
  if (kind == LB_MEM_HOST) { memcpy(ring, src, n); return LB_OK; }
  Cuda* k = (Cuda*)ctx;
  int e = bind(k);
  if (!e) lb_note_op("cuMemcpyDtoHAsync (put source into the ring)");
  if (!e) e = cu_check(cu.memcpyDtoHAsync(ring, (CUdeviceptr)src, n, k->stream), "cuMemcpyDtoHAsync (put source into the ring)");
  if (!e) lb_note_op("cuStreamSynchronize (put source into the ring)");
  if (!e) e = cu_check(cu.streamSynchronize(k->stream), "cuStreamSynchronize (put source into the ring)");
  return e;
}

int cuda_from_ring(void* ctx, void* dst, int kind, const void* ring, size_t n) {
  if (kind == LB_MEM_HOST) { memcpy(dst, ring, n); return LB_OK; }
  Cuda* k = (Cuda*)ctx;
  int e = bind(k);
  if (!e) lb_note_op("cuMemcpyHtoDAsync (ring into the window)");
  if (!e) e = cu_check(cu.memcpyHtoDAsync((CUdeviceptr)dst, ring, n, k->stream), "cuMemcpyHtoDAsync (ring into the window)");
  // the slot is handed back to the source once this returns: the copy must have read it
  if (!e) lb_note_op("cuStreamSynchronize (ring into the window)");
  if (!e) e = cu_check(cu.streamSynchronize(k->stream), "cuStreamSynchronize (ring into the window)");
  return e;
}

// A signal add on device memory, done by the copy engine: read the word, add, write it back. No SM
// is needed, so a kernel that holds every SM while it waits for this very signal cannot starve it
// (a one-thread add kernel could not start then). Not an atomic on the GPU, and it need not be: the
// receiving progress thread is the only writer of a signal word once the set-up kernels have reset
// it, and a kernel only reads it; an aligned 8-byte copy lands whole. On the same stream after
// the data copy, so the signal is seen after its data.
int cuda_signal_add(void* ctx, uint64_t* addr, int kind, uint64_t value) {
  if (kind == LB_MEM_HOST) { __atomic_fetch_add(addr, value, __ATOMIC_RELEASE); return LB_OK; }
  Cuda* k = (Cuda*)ctx;
  int e = bind(k);
  if (!e) lb_note_op("cuMemcpyDtoHAsync (signal read)");
  if (!e) e = cu_check(cu.memcpyDtoHAsync(&k->signalWord, (CUdeviceptr)addr, 8, k->stream), "cuMemcpyDtoHAsync (signal read)");
  if (!e) lb_note_op("cuStreamSynchronize (signal read)");
  if (!e) e = cu_check(cu.streamSynchronize(k->stream), "cuStreamSynchronize (signal read)");
  if (!e) k->signalWord += value;
  if (!e) lb_note_op("cuMemcpyHtoDAsync (signal write)");
  if (!e) e = cu_check(cu.memcpyHtoDAsync((CUdeviceptr)addr, &k->signalWord, 8, k->stream), "cuMemcpyHtoDAsync (signal write)");
  if (!e) lb_note_op("cuStreamSynchronize (signal write)");
  if (!e) e = cu_check(cu.streamSynchronize(k->stream), "cuStreamSynchronize (signal write)");
  return e;
}

void cuda_map_hook(void* ctx, void* base, size_t size, int mapped) {
  Cuda* k = (Cuda*)ctx;
  if (bind(k)) return;
  if (mapped) {
    lb_note_op("cuMemHostRegister (ring memory)");
    CUresult r = cu.memHostRegister(base, size, CU_MEMHOSTREGISTER_PORTABLE);
    lb_note_op(nullptr);
    if (r != CUDA_SUCCESS) info("ring memory of %zu bytes not pinned (cuMemHostRegister: %d): copies are slower", size, (int)r);
  } else {
    cu.memHostUnregister(base);  // fails harmlessly where registering failed
  }
}

struct Comm {
  lb_comm* core = nullptr;
  Cuda cuda;
  int rank = 0, nranks = 0, contexts = 0;
};

ncclResult_t lbInit(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction) {
  g_nccl_log = logFunction;
  lb_set_log(to_nccl_log);
  *ctx = calloc(1, sizeof(uint64_t));
  if (!*ctx) return ncclSystemError;
  *(uint64_t*)*ctx = commId;
  info("test transport for hosts without RDMA devices: puts move through shared memory between the processes of this machine");
  return ncclSuccess;
}

ncclResult_t lbDevices(int* ndev) {
  *ndev = 1;
  return ncclSuccess;
}

char kName[] = "gin4j-loopback";

ncclResult_t lbGetProperties(int dev, ncclNetProperties_v11_t* props) {
  if (dev != 0) {
    warn("getProperties: device %d asked for; this transport has device 0 only", dev);
    return ncclInvalidArgument;
  }
  memset(props, 0, sizeof *props);
  props->name = kName;
  props->pciPath = nullptr;  // no PCI device: NCCL attaches it to the CPU
  props->guid = 0x67696e346a6c62ull;
  props->ptrSupport = NCCL_PTR_HOST | NCCL_PTR_CUDA;
  props->speed = 100000;  // nominal; nothing here runs at a network's speed
  props->maxComms = 65536;
  props->maxRecvs = 8;    // NCCL sizes its descriptor queues as 32 x this
  props->netDeviceType = NCCL_NET_DEVICE_GIN_PROXY;
  props->netDeviceVersion = NCCL_GIN_PROXY_VERSION;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = 0;
  props->maxP2pBytes = MAX_GIN_SIZE;
  props->maxCollBytes = MAX_GIN_SIZE;
  props->maxMultiRequestSize = 1;
  return ncclSuccess;
}

ncclResult_t lbListen(void* ctx, int dev, void* handle, void** listenComm) {
  (void)ctx;
  static_assert(sizeof(lb_handle) <= NCCL_NET_HANDLE_MAXSIZE, "the handle must fit NCCL's");
  if (dev != 0) {
    warn("listen: device %d; this transport has device 0 only", dev);
    return ncclInvalidArgument;
  }
  memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
  int e = lb_listen((lb_handle*)handle);
  if (e) return to_nccl(e);
  *listenComm = calloc(1, 1);
  return *listenComm ? ncclSuccess : ncclSystemError;
}

ncclResult_t lbConnect(void* ctx, void* handles[], int nranks, int rank, int nConnections, int queueDepth,
                       void* listenComm, void** collComm) {
  (void)ctx; (void)queueDepth; (void)listenComm;
  *collComm = nullptr;
  lb_handle* all = (lb_handle*)calloc((size_t)nranks, sizeof(lb_handle));
  Comm* c = new Comm();
  if (!all) { delete c; return ncclSystemError; }
  for (int r = 0; r < nranks; r++) memcpy(&all[r], handles[r], sizeof(lb_handle));
  c->rank = rank;
  c->nranks = nranks;
  c->contexts = nConnections;
  int e = load_driver() ? cu_check(cu.ctxGetCurrent(&c->cuda.ctx), "cuCtxGetCurrent") : LB_ESYS;
  if (!e && !c->cuda.ctx) {
    warn("connect: no CUDA context is current on this thread");
    e = LB_EINVAL;
  }
  if (!e) e = cu_check(cu.streamCreate(&c->cuda.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  lb_ops ops = {&c->cuda, cuda_to_ring, cuda_from_ring, cuda_signal_add, cuda_map_hook};
  if (!e) e = lb_connect(all, nranks, rank, &ops, &c->core);
  free(all);
  if (e) {
    if (c->cuda.stream) cu.streamDestroy(c->cuda.stream);
    delete c;
    return to_nccl(e);
  }
  info("rank %d of %d connected, %d contexts", rank, nranks, nConnections);
  *collComm = c;
  return ncclSuccess;
}

ncclResult_t lbCreateContext(void*, int, int, int, void**, ncclNetDeviceHandle_v11_t**) {
  warn("createContext: this is a proxy GIN device; NCCL makes the contexts itself");
  return ncclInvalidUsage;
}

ncclResult_t lbRegMrSym(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle, void** ginHandle) {
  (void)mrFlags;  // every piece is applied in order: strong ordering always holds
  Comm* c = (Comm*)collComm;
  if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
    warn("regMrSym: memory type %d; this transport takes NCCL_PTR_HOST (%d) and NCCL_PTR_CUDA (%d)", type, NCCL_PTR_HOST, NCCL_PTR_CUDA);
    return ncclInvalidArgument;
  }
  lb_reg* r = nullptr;
  int e = lb_register(c->core, data, size, type == NCCL_PTR_CUDA ? LB_MEM_DEVICE : LB_MEM_HOST, &r);
  if (e) return to_nccl(e);
  // NCCL hands back either handle as the put's memory handle (the device's descriptors carry the
  // GIN handle, its inline buffer the plain one): both are the registration
  *mhandle = r;
  *ginHandle = r;
  return ncclSuccess;
}

ncclResult_t lbRegMrSymDmaBuf(void*, void*, size_t, int, uint64_t, int, uint64_t, void**, void**) {
  warn("regMrSymDmaBuf: DMA-BUF is not supported (not advertised in ptrSupport)");
  return ncclInvalidUsage;
}

ncclResult_t lbDeregMrSym(void* collComm, void* mhandle) {
  return to_nccl(lb_deregister(((Comm*)collComm)->core, (lb_reg*)mhandle));
}

ncclResult_t lbDestroyContext(void*) { return ncclSuccess; }

ncclResult_t lbCloseColl(void* collComm) {
  Comm* c = (Comm*)collComm;
  if (!c) return ncclSuccess;
  for (int p = 0; p < c->nranks; p++) {
    lb_stats s;
    lb_stats_of(p, &s);
    if (s.puts || s.signals || s.putsIn || s.signalsIn)
      info("rank %d with rank %d, this process so far: sent %llu puts, %llu signals, %llu bytes; received %llu puts, %llu signals, %llu bytes",
           c->rank, p, (unsigned long long)s.puts, (unsigned long long)s.signals, (unsigned long long)s.bytes,
           (unsigned long long)s.putsIn, (unsigned long long)s.signalsIn, (unsigned long long)s.bytesIn);
  }
  bind(&c->cuda);
  int e = lb_close(c->core);
  if (c->cuda.stream) cu.streamDestroy(c->cuda.stream);
  delete c;
  return to_nccl(e);
}

ncclResult_t lbCloseListen(void* listenComm) {
  free(listenComm);
  return ncclSuccess;
}

int signal_op(uint32_t op) {
  return op == NCCL_NET_SIGNAL_OP_INC ? LB_SIGNAL_INC : op == NCCL_NET_SIGNAL_OP_ADD ? LB_SIGNAL_ADD : -1;
}

ncclResult_t put(Comm* c, uint64_t srcOff, void* src, size_t size, uint64_t dstOff, void* dst, uint32_t rank,
                 void* sig, uint64_t sigOff, int sigOp, uint64_t sigValue, int connectionId, void** request) {
  if (connectionId < 0 || connectionId >= c->contexts) {
    warn("put to rank %u on context %d; this connection has contexts 0 to %d", rank, connectionId, c->contexts - 1);
    return ncclInvalidArgument;
  }
  lb_request* r = nullptr;
  int e = lb_put(c->core, (int)rank, (lb_reg*)src, srcOff, size, (lb_reg*)dst, dstOff, (lb_reg*)sig, sigOff, sigOp, sigValue, &r);
  *request = r;
  return to_nccl(e);
}

ncclResult_t lbIput(void* collComm, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff, void* dstMhandle,
                    uint32_t rank, int connectionId, void** request) {
  return put((Comm*)collComm, srcOff, srcMhandle, size, dstOff, dstMhandle, rank, nullptr, 0, LB_SIGNAL_NONE, 0, connectionId, request);
}

ncclResult_t lbIputSignal(void* collComm, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff, void* dstMhandle,
                          uint32_t rank, uint64_t signalOff, void* signalMhandle, uint64_t signalValue, uint32_t signalOp,
                          int connectionId, void** request) {
  int op = signal_op(signalOp);
  if (op < 0 || !signalMhandle) {
    warn("iputSignal to rank %u: signal op %u on handle %p; expected NCCL_NET_SIGNAL_OP_INC (%d) or _ADD (%d) on a registration",
         rank, signalOp, signalMhandle, NCCL_NET_SIGNAL_OP_INC, NCCL_NET_SIGNAL_OP_ADD);
    return ncclInvalidArgument;
  }
  return put((Comm*)collComm, srcOff, srcMhandle, size, dstOff, dstMhandle, rank, signalMhandle, signalOff, op, signalValue,
             connectionId, request);
}

ncclResult_t lbTest(void* collComm, void* request, int* done) {
  return to_nccl(lb_test(((Comm*)collComm)->core, (lb_request*)request, done));
}

ncclResult_t lbProgress(void* collComm) {
  Comm* c = (Comm*)collComm;
  int e = bind(&c->cuda);
  return to_nccl(e ? e : lb_progress(c->core));
}

ncclResult_t lbQueryLastError(void*, bool* hasError) {
  *hasError = false;  // errors are returned by the calls themselves
  return ncclSuccess;
}

ncclResult_t lbFinalize(void* ctx) {
  free(ctx);
  return ncclSuccess;
}

}  // namespace

extern "C" {
__attribute__((visibility("default"))) ncclGin_v12_t ncclGinPlugin_v12 = {
    kName, lbInit, lbDevices, lbGetProperties, lbListen, lbConnect, lbCreateContext, lbRegMrSym, lbRegMrSymDmaBuf,
    lbDeregMrSym, lbDestroyContext, lbCloseColl, lbCloseListen, lbIput, lbIputSignal, lbTest, lbProgress,
    lbQueryLastError, lbFinalize,
};

// What this process has put on the "network" with `peer` so far, for tests: out[0..5] = puts,
// signals and bytes sent, then received. Returns 0, or -1 for a rank outside [0, 256).
__attribute__((visibility("default"))) int gin4j_loopback_stats(int peer, uint64_t* out) {
  if (peer < 0 || peer >= LB_MAX_RANKS) return -1;
  lb_stats s;
  lb_stats_of(peer, &s);
  uint64_t v[6] = {s.puts, s.signals, s.bytes, s.putsIn, s.signalsIn, s.bytesIn};
  memcpy(out, v, sizeof v);
  return 0;
}
}
