// gin-kernels-test: -x c++ -cudart=none
// launch_bench: the C baseline for the Java launch-cost benchmark (jmh/). Loads basic.cubin with
// the CUDA driver API only and measures the empty kernel gin_empty launched 1x1 on a non-blocking
// stream:
//   async_ns_per_launch    N launches back to back, then one cuStreamSynchronize; total / N
//                          (median over several batches)
//   launch_sync_us_median  one launch + cuStreamSynchronize, median over many samples
// Prints one JSON line. The driver library is opened with dlopen (as the JVM does), so this
// builds on machines without a driver; no CUDA runtime is linked (-cudart=none); every call's
// result is checked.
//
// usage: launch_bench <basic.cubin> [--device N] [--launches N] [--batches N] [--samples N] [--warmup N]
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define GIN_STR2(x) #x
#define GIN_STR(x) GIN_STR2(x)

// cuda.h maps some names to versioned symbols (cuStreamDestroy -> cuStreamDestroy_v2, ...);
// GIN_STR expands the macro first, so dlsym looks up exactly the symbol a -lcuda link would use.
struct Driver {
  decltype(&cuGetErrorName) getErrorName;
  decltype(&cuGetErrorString) getErrorString;
  decltype(&cuInit) init;
  decltype(&cuDriverGetVersion) driverGetVersion;
  decltype(&cuDeviceGetCount) deviceGetCount;
  decltype(&cuDeviceGet) deviceGet;
  decltype(&cuDeviceGetName) deviceGetName;
  decltype(&cuDevicePrimaryCtxRetain) primaryCtxRetain;
  decltype(&cuDevicePrimaryCtxRelease) primaryCtxRelease;
  decltype(&cuCtxSetCurrent) ctxSetCurrent;
  decltype(&cuModuleLoad) moduleLoad;
  decltype(&cuModuleUnload) moduleUnload;
  decltype(&cuModuleGetFunction) moduleGetFunction;
  decltype(&cuStreamCreate) streamCreate;
  decltype(&cuStreamDestroy) streamDestroy;
  decltype(&cuStreamSynchronize) streamSynchronize;
  decltype(&cuLaunchKernel) launchKernel;
};

static Driver drv;

static void die(const std::string& message) {
  fprintf(stderr, "launch_bench: %s\n", message.c_str());
  exit(1);
}

static void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  if (drv.getErrorName == nullptr || drv.getErrorName(result, &name) != CUDA_SUCCESS) name = "unknown error";
  if (drv.getErrorString == nullptr || drv.getErrorString(result, &text) != CUDA_SUCCESS) text = "";
  fprintf(stderr, "launch_bench: %s failed: %s (%d): %s; expected CUDA_SUCCESS\n", call, name, (int)result, text);
  exit(1);
}
#define CHECK(call) check((call), #call)

template <typename F> static void loadSymbol(void* lib, const char* symbol, F& target) {
  void* address = dlsym(lib, symbol);
  if (address == nullptr) die(std::string("libcuda.so.1 has no symbol ") + symbol + " (driver too old?)");
  target = reinterpret_cast<F>(address);
}
#define LOAD(field, function) loadSymbol(lib, GIN_STR(function), drv.field)

static void loadDriver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) die(std::string("cannot load the CUDA driver libcuda.so.1: ") + dlerror());
  LOAD(getErrorName, cuGetErrorName);
  LOAD(getErrorString, cuGetErrorString);
  LOAD(init, cuInit);
  LOAD(driverGetVersion, cuDriverGetVersion);
  LOAD(deviceGetCount, cuDeviceGetCount);
  LOAD(deviceGet, cuDeviceGet);
  LOAD(deviceGetName, cuDeviceGetName);
  LOAD(primaryCtxRetain, cuDevicePrimaryCtxRetain);
  LOAD(primaryCtxRelease, cuDevicePrimaryCtxRelease);
  LOAD(ctxSetCurrent, cuCtxSetCurrent);
  LOAD(moduleLoad, cuModuleLoad);
  LOAD(moduleUnload, cuModuleUnload);
  LOAD(moduleGetFunction, cuModuleGetFunction);
  LOAD(streamCreate, cuStreamCreate);
  LOAD(streamDestroy, cuStreamDestroy);
  LOAD(streamSynchronize, cuStreamSynchronize);
  LOAD(launchKernel, cuLaunchKernel);
}

static long parseAtLeast(const char* option, const char* value, long minimum) {
  char* end = nullptr;
  long parsed = value ? strtol(value, &end, 10) : -1;
  if (value == nullptr || *value == '\0' || *end != '\0' || parsed < minimum) {
    die(std::string(option) + " expects an integer >= " + std::to_string(minimum));
  }
  return parsed;
}

static double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

static double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, (size_t)(p * (values.size() - 1) + 0.5))];
}

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    die("usage: launch_bench <basic.cubin> [--device N] [--launches N] [--batches N] [--samples N] [--warmup N]");
  }
  const char* cubinPath = argv[1];
  int device = 0;
  long launches = 20000, batches = 11, samples = 20000, warmup = 2000;
  for (int i = 2; i < argc; i++) {
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!strcmp(argv[i], "--device")) { device = (int)parseAtLeast(argv[i], value, 0); i++; }
    else if (!strcmp(argv[i], "--launches")) { launches = parseAtLeast(argv[i], value, 1); i++; }
    else if (!strcmp(argv[i], "--batches")) { batches = parseAtLeast(argv[i], value, 1); i++; }
    else if (!strcmp(argv[i], "--samples")) { samples = parseAtLeast(argv[i], value, 1); i++; }
    else if (!strcmp(argv[i], "--warmup")) { warmup = parseAtLeast(argv[i], value, 1); i++; }
    else die(std::string("unknown option ") + argv[i]);
  }

  loadDriver();
  CHECK(drv.init(0));
  int driverVersion = 0, deviceCount = 0;
  CHECK(drv.driverGetVersion(&driverVersion));
  CHECK(drv.deviceGetCount(&deviceCount));
  if (device < 0 || device >= deviceCount) {
    die("--device " + std::to_string(device) + " is out of range: " + std::to_string(deviceCount) + " device(s)");
  }
  CUdevice dev;
  CHECK(drv.deviceGet(&dev, device));
  char deviceName[256] = {0};
  CHECK(drv.deviceGetName(deviceName, sizeof deviceName - 1, dev));
  CUcontext ctx;
  CHECK(drv.primaryCtxRetain(&ctx, dev));
  CHECK(drv.ctxSetCurrent(ctx));
  CUmodule module;
  CHECK(drv.moduleLoad(&module, cubinPath));
  CUfunction empty;
  CHECK(drv.moduleGetFunction(&empty, module, "gin_empty"));
  CUstream stream;
  CHECK(drv.streamCreate(&stream, CU_STREAM_NON_BLOCKING));

  using clock = std::chrono::steady_clock;
  auto launch = [&]() { return drv.launchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr); };

  for (long i = 0; i < warmup; i++) {
    CHECK(launch());
    CHECK(drv.streamSynchronize(stream));
  }

  // (a) throughput: back-to-back launches, one sync per batch.
  std::vector<double> nsPerLaunch;
  for (long b = 0; b < batches; b++) {
    auto t0 = clock::now();
    for (long i = 0; i < launches; i++) {
      CUresult r = launch();
      if (r != CUDA_SUCCESS) check(r, "cuLaunchKernel(gin_empty) in the async loop");
    }
    CHECK(drv.streamSynchronize(stream));
    auto t1 = clock::now();
    nsPerLaunch.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / (double)launches);
  }

  // (b) latency: launch + synchronize, one at a time.
  std::vector<double> syncUs;
  syncUs.reserve(samples);
  for (long i = 0; i < samples; i++) {
    auto t0 = clock::now();
    CUresult r = launch();
    if (r != CUDA_SUCCESS) check(r, "cuLaunchKernel(gin_empty) in the sync loop");
    r = drv.streamSynchronize(stream);
    if (r != CUDA_SUCCESS) check(r, "cuStreamSynchronize in the sync loop");
    auto t1 = clock::now();
    syncUs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }

  CHECK(drv.streamDestroy(stream));
  CHECK(drv.moduleUnload(module));
  CHECK(drv.primaryCtxRelease(dev));

  printf("{\"lang\":\"c\",\"async_ns_per_launch\":%.1f,\"launch_sync_us_median\":%.3f,"
         "\"launch_sync_us_p10\":%.3f,\"launch_sync_us_p90\":%.3f,\"launches_per_batch\":%ld,\"batches\":%ld,"
         "\"samples\":%ld,\"device\":\"%s\",\"driver\":%d}\n",
         median(nsPerLaunch), median(syncUs), percentile(syncUs, 0.10), percentile(syncUs, 0.90),
         launches, batches, samples, deviceName, driverVersion);
  return 0;
}
