// lb_core_test.c - CPU test of the loopback GIN transport's core (lb_core.h): forked processes as
// ranks, host memory as windows. Checks every byte, the order of data and signals as another thread
// sees it, a full ring, the counters, and peers that go away. Exit status 0 when every check holds.
#define _GNU_SOURCE
#include "lb_core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WIN_BYTES (4u << 20)
#define SIG_BYTES 4096u

typedef struct {
  _Atomic int arrived[8];
  lb_handle handles[8];
} shared_area;

static shared_area* g_shared;
static int g_fails;

#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, "lb_core_test: FAILED (%s:%d): ", __FILE__, __LINE__); \
  fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); g_fails++; } } while (0)

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int host_to_ring(void* ctx, void* ring, const void* src, int kind, size_t n) { (void)ctx; (void)kind; memcpy(ring, src, n); return LB_OK; }
static int host_from_ring(void* ctx, void* dst, int kind, const void* ring, size_t n) { (void)ctx; (void)kind; memcpy(dst, ring, n); return LB_OK; }
static int host_signal(void* ctx, uint64_t* addr, int kind, uint64_t v) {
  (void)ctx; (void)kind;
  atomic_fetch_add_explicit((_Atomic uint64_t*)addr, v, memory_order_release);
  return LB_OK;
}
static const lb_ops host_ops = {NULL, host_to_ring, host_from_ring, host_signal, NULL};

// Every rank of `phase` arrives, then all go on (the handles are published before arriving).
static void barrier(int phase, int nranks) {
  atomic_fetch_add(&g_shared->arrived[phase], 1);
  while (atomic_load(&g_shared->arrived[phase]) < nranks) usleep(100);
}

static uint8_t pattern(int src, int dst, size_t i) { return (uint8_t)(i * 131u + (unsigned)src * 17u + (unsigned)dst * 7u + 1u); }

typedef struct {
  lb_comm* c;
  lb_reg *win, *sig, *src;
  uint8_t *winMem, *srcMem;
  uint64_t* sigMem;
} rank_state;

static rank_state setup(int rank, int nranks) {
  rank_state s = {0};
  CHECK(lb_listen(&g_shared->handles[rank]) == LB_OK, "listen");
  barrier(0, nranks);
  CHECK(lb_connect(g_shared->handles, nranks, rank, &host_ops, &s.c) == LB_OK, "connect rank %d", rank);
  s.winMem = calloc(1, WIN_BYTES);
  s.srcMem = malloc(WIN_BYTES);
  s.sigMem = calloc(1, SIG_BYTES);
  memset(s.winMem, 0xEE, WIN_BYTES);  // poisoned: every byte a put must write is checked
  // the same order on every rank: window, signals, then the private source (registered last)
  CHECK(lb_register(s.c, s.winMem, WIN_BYTES, LB_MEM_DEVICE, &s.win) == LB_OK, "register window");
  CHECK(lb_register(s.c, s.sigMem, SIG_BYTES, LB_MEM_DEVICE, &s.sig) == LB_OK, "register signals");
  CHECK(lb_register(s.c, s.srcMem, WIN_BYTES, LB_MEM_HOST, &s.src) == LB_OK, "register source");
  return s;
}

static void wait_all(lb_comm* c, lb_request** reqs, int n) {
  uint64_t start = now_ms();
  for (int i = 0; i < n; i++) {
    int done = 0;
    while (!done && now_ms() - start < 10000) {
      CHECK(lb_progress(c) == LB_OK, "progress");
      CHECK(lb_test(c, reqs[i], &done) == LB_OK, "test");
      if (g_fails) return;
    }
    CHECK(done, "request %d never completed", i);
  }
}

// Every rank puts a random-length block to every rank (itself included), with a signal; then
// checks every byte it received and the counters of each pair.
static void all_to_all(int rank, int nranks) {
  rank_state s = setup(rank, nranks);
  size_t block = WIN_BYTES / (size_t)nranks;
  size_t len[8];
  for (int d = 0; d < nranks; d++) len[d] = (block * (size_t)(rank + d + 1)) / (size_t)(2 * nranks);
  for (int d = 0; d < nranks; d++) for (size_t i = 0; i < len[d]; i++) s.srcMem[(size_t)d * block + i] = pattern(rank, d, i);
  lb_stats before[8];
  for (int p = 0; p < nranks; p++) lb_stats_of(p, &before[p]);
  lb_request* reqs[8];
  for (int d = 0; d < nranks; d++)
    CHECK(lb_put(s.c, d, s.src, (uint64_t)d * block, len[d], s.win, (uint64_t)rank * block, s.sig, 8u * (unsigned)rank,
                 LB_SIGNAL_ADD, 1000 + (uint64_t)rank, &reqs[d]) == LB_OK, "put to %d", d);
  wait_all(s.c, reqs, nranks);
  uint64_t start = now_ms();
  for (int p = 0; p < nranks; p++)
    while (atomic_load_explicit((_Atomic uint64_t*)&s.sigMem[p], memory_order_acquire) != 1000 + (uint64_t)p && now_ms() - start < 10000)
      CHECK(lb_progress(s.c) == LB_OK, "progress while waiting");
  for (int p = 0; p < nranks; p++) {
    CHECK(s.sigMem[p] == 1000 + (uint64_t)p, "rank %d: signal from %d is %llu", rank, p, (unsigned long long)s.sigMem[p]);
    size_t n = (block * (size_t)(p + rank + 1)) / (size_t)(2 * nranks), bad = 0;
    for (size_t i = 0; i < block; i++) {
      uint8_t want = i < n ? pattern(p, rank, i) : 0xEE;
      if (s.winMem[(size_t)p * block + i] != want) bad++;
    }
    CHECK(bad == 0, "rank %d: %zu wrong bytes from rank %d", rank, bad, p);
  }
  for (int p = 0; p < nranks; p++) {
    lb_stats a;
    lb_stats_of(p, &a);
    size_t in = (block * (size_t)(p + rank + 1)) / (size_t)(2 * nranks);
    CHECK(a.puts - before[p].puts == 1 && a.signals - before[p].signals == 1 && a.bytes - before[p].bytes == len[p],
          "rank %d -> %d counted %llu puts %llu signals %llu bytes", rank, p, (unsigned long long)(a.puts - before[p].puts),
          (unsigned long long)(a.signals - before[p].signals), (unsigned long long)(a.bytes - before[p].bytes));
    CHECK(a.putsIn - before[p].putsIn == 1 && a.signalsIn - before[p].signalsIn == 1 && a.bytesIn - before[p].bytesIn == in,
          "rank %d <- %d counted %llu bytes in, expected %zu", rank, p, (unsigned long long)(a.bytesIn - before[p].bytesIn), in);
  }
  barrier(1, nranks);  // nobody closes while a peer may still drain into it
  CHECK(lb_close(s.c) == LB_OK, "close");
}

// The receiver's data as another thread sees it: a signal is never ahead of its data.
typedef struct { rank_state* s; _Atomic int stop; int violations; uint64_t seen; } watcher;
static void* watch(void* arg) {
  watcher* w = arg;
  volatile uint64_t* value = (volatile uint64_t*)(w->s->winMem + (3u << 20));
  while (!atomic_load(&w->stop)) {
    uint64_t big = atomic_load_explicit((_Atomic uint64_t*)&w->s->sigMem[0], memory_order_acquire);
    if (big == 5) {  // the 3 MiB put has landed whole
      for (size_t i = 0; i < (3u << 20); i += 4093) if (w->s->winMem[i] != pattern(0, 1, i)) w->violations++;
    }
    uint64_t k = atomic_load_explicit((_Atomic uint64_t*)&w->s->sigMem[1], memory_order_acquire);
    if (k > 0 && *value < k) w->violations++;  // put k wrote k before its signal reached k
    if (k > w->seen) w->seen = k;
  }
  return NULL;
}

static void ordering(int rank) {
  rank_state s = setup(rank, 2);
  enum { SMALL = 200 };
  if (rank == 0) {
    for (size_t i = 0; i < (3u << 20); i++) s.srcMem[i] = pattern(0, 1, i);
    lb_request* reqs[SMALL + 1];
    CHECK(lb_put(s.c, 1, s.src, 0, 3u << 20, s.win, 0, s.sig, 0, LB_SIGNAL_ADD, 5, &reqs[0]) == LB_OK, "big put");
    uint64_t* vals = (uint64_t*)(s.srcMem + (3u << 20));
    for (int k = 1; k <= SMALL; k++) {
      vals[k] = (uint64_t)k;  // a distinct source word per put: a pending put's source is not reused
      CHECK(lb_put(s.c, 1, s.src, (3u << 20) + 8u * (unsigned)k, 8, s.win, 3u << 20, s.sig, 8, LB_SIGNAL_INC, 0, &reqs[k]) == LB_OK, "put %d", k);
    }
    wait_all(s.c, reqs, SMALL + 1);
  } else {
    watcher w = {.s = &s};
    pthread_t t;
    pthread_create(&t, NULL, watch, &w);
    uint64_t start = now_ms();
    while (atomic_load_explicit((_Atomic uint64_t*)&s.sigMem[1], memory_order_acquire) < SMALL && now_ms() - start < 10000)
      CHECK(lb_progress(s.c) == LB_OK, "progress");
    atomic_store(&w.stop, 1);
    pthread_join(t, NULL);
    CHECK(s.sigMem[0] == 5 && s.sigMem[1] == SMALL, "signals %llu and %llu, expected 5 and %d", (unsigned long long)s.sigMem[0],
          (unsigned long long)s.sigMem[1], SMALL);
    CHECK(w.violations == 0, "%d times a signal was seen before its data", w.violations);
    CHECK(*(uint64_t*)(s.winMem + (3u << 20)) == SMALL, "the last small put's value is %llu", (unsigned long long)*(uint64_t*)(s.winMem + (3u << 20)));
    size_t bad = 0;
    for (size_t i = 0; i < (3u << 20); i++) if (s.winMem[i] != pattern(0, 1, i)) bad++;
    CHECK(bad == 0, "%zu wrong bytes in the big put", bad);
  }
  barrier(1, 2);
  lb_close(s.c);
}

// More pieces than the ring holds while the receiver does not progress: puts and progress return
// at once, the requests stay pending, and complete once the receiver drains.
static void full_ring(int rank) {
  rank_state s = setup(rank, 2);
  enum { PUTS = 64 };  // x 64 KiB slot = 4 MiB, 16 slots in the ring
  if (rank == 0) {
    for (size_t i = 0; i < WIN_BYTES; i++) s.srcMem[i] = pattern(0, 1, i);
    lb_request* reqs[PUTS];
    uint64_t t0 = now_ms();
    for (int k = 0; k < PUTS; k++)
      CHECK(lb_put(s.c, 1, s.src, (uint64_t)k * 65536u, 65536, s.win, (uint64_t)k * 65536u, s.sig, 0, LB_SIGNAL_INC, 0, &reqs[k]) == LB_OK, "put %d", k);
    for (int i = 0; i < 100; i++) CHECK(lb_progress(s.c) == LB_OK, "progress on a full ring");
    int done = 0;
    CHECK(lb_test(s.c, reqs[PUTS - 1], &done) == LB_OK && !done, "the last put completed although the ring was full");
    CHECK(now_ms() - t0 < 150, "puts and progress took %llu ms on a full ring", (unsigned long long)(now_ms() - t0));
    barrier(2, 2);  // the receiver starts draining now
    wait_all(s.c, reqs, PUTS);
  } else {
    barrier(2, 2);
    uint64_t start = now_ms();
    while (atomic_load_explicit((_Atomic uint64_t*)&s.sigMem[0], memory_order_acquire) < PUTS && now_ms() - start < 10000)
      CHECK(lb_progress(s.c) == LB_OK, "progress");
    size_t bad = 0;
    for (size_t i = 0; i < WIN_BYTES; i++) if (s.winMem[i] != pattern(0, 1, i)) bad++;
    CHECK(s.sigMem[0] == PUTS && bad == 0, "signal %llu of %d, %zu wrong bytes", (unsigned long long)s.sigMem[0], PUTS, bad);
  }
  barrier(1, 2);
  lb_close(s.c);
}

// Rank 1 leaves without closing: rank 0's progress reports it, naming the peer, within a second,
// and the puts to it complete with that error (NCCL's flush must not wait for them).
// With closeFirst, rank 1 closes before it leaves: no error until rank 0 puts to it.
static void peer_leaves(int rank, int closeFirst) {
  rank_state s = setup(rank, 2);
  uint64_t start = now_ms();
  while (now_ms() - start < 300) CHECK(lb_progress(s.c) == LB_OK, "progress before rank 1 leaves");  // maps the peer
  if (rank == 1) {
    if (closeFirst) lb_close(s.c);
    barrier(1, 2);
    _exit(0);
  }
  barrier(1, 2);
  int e = LB_OK;
  start = now_ms();
  if (closeFirst) {
    while (e == LB_OK && now_ms() - start < 300) e = lb_progress(s.c);
    CHECK(e == LB_OK, "a peer that closed and left was reported (%d) with no puts to it", e);
  }
  lb_request* reqs[64];
  for (int k = 0; k < 64; k++) CHECK(lb_put(s.c, 1, s.src, 0, 65536, s.win, 0, NULL, 0, LB_SIGNAL_NONE, 0, &reqs[k]) == LB_OK, "put");
  start = now_ms();
  e = LB_OK;
  while (e == LB_OK && now_ms() - start < 2000) e = lb_progress(s.c);
  CHECK(e == LB_EPEER && now_ms() - start < 1000, "progress returned %d after %llu ms; expected LB_EPEER (%d) within 1 s",
        e, (unsigned long long)(now_ms() - start), LB_EPEER);
  int done = 0;
  CHECK(lb_test(s.c, reqs[63], &done) == LB_EPEER && done, "a put to the gone peer did not complete with the error");
  for (int k = 0; k < 63; k++) {  // the first ones may have reached the ring before the peer left
    done = 0;
    int t = lb_test(s.c, reqs[k], &done);
    CHECK(done && (t == LB_OK || t == LB_EPEER), "put %d to the gone peer: test gave %d, done %d", k, t, done);
  }
  lb_request* late = NULL;
  CHECK(lb_put(s.c, 1, s.src, 0, 64, s.win, 0, NULL, 0, LB_SIGNAL_NONE, 0, &late) == LB_EPEER && late == NULL,
        "a put after the error was taken");
  lb_close(s.c);
}

// A put that names a registration its receiver has not made yet waits in the ring (the sender has
// returned from a collective registration first) and lands once the receiver registers.
static void late_registration(int rank) {
  rank_state s = setup(rank, 2);
  enum { N = 4096 };
  if (rank == 0) {
    uint8_t* extra = malloc(N);
    lb_reg* r = NULL;
    CHECK(lb_register(s.c, extra, N, LB_MEM_DEVICE, &r) == LB_OK, "register the fourth window");
    for (size_t i = 0; i < N; i++) s.srcMem[i] = pattern(0, 1, i);
    lb_request* req;
    CHECK(lb_put(s.c, 1, s.src, 0, N, r, 0, s.sig, 0, LB_SIGNAL_INC, 0, &req) == LB_OK, "put into the fourth window");
    wait_all(s.c, &req, 1);
    barrier(2, 2);  // the piece is in rank 1's ring before rank 1 registers
    barrier(3, 2);
    lb_deregister(s.c, r);
    free(extra);
  } else {
    uint8_t* extra = malloc(N);
    memset(extra, 0xEE, N);
    barrier(2, 2);
    for (int i = 0; i < 50; i++) CHECK(lb_progress(s.c) == LB_OK, "progress before the registration exists");
    CHECK(s.sigMem[0] == 0, "the signal of a put into an unregistered window was applied");
    lb_reg* r = NULL;
    CHECK(lb_register(s.c, extra, N, LB_MEM_DEVICE, &r) == LB_OK, "register the fourth window");
    uint64_t start = now_ms();
    while (atomic_load_explicit((_Atomic uint64_t*)&s.sigMem[0], memory_order_acquire) < 1 && now_ms() - start < 5000)
      CHECK(lb_progress(s.c) == LB_OK, "progress");
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) if (extra[i] != pattern(0, 1, i)) bad++;
    CHECK(s.sigMem[0] == 1 && bad == 0, "signal %llu, %zu wrong bytes after the late registration", (unsigned long long)s.sigMem[0], bad);
    barrier(3, 2);
    lb_deregister(s.c, r);
    free(extra);
  }
  barrier(1, 2);
  lb_close(s.c);
}

// Runs body(rank) in nranks forked processes; a rank that crashes or hangs (alarm) fails the test.
static int run(const char* name, int nranks, void (*body)(int rank, int arg), int arg) {
  memset(g_shared, 0, sizeof *g_shared);
  pid_t pids[8];
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      alarm(30);
      body(r, arg);
      _exit(g_fails ? 1 : 0);
    }
  }
  int ok = 1;
  for (int r = 0; r < nranks; r++) {  // reaped as they end: one left a zombie would still look alive
    int st;
    if (waitpid(-1, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = 0;
  }
  (void)pids;
  printf("lb_core_test: %s: %s\n", name, ok ? "passed" : "FAILED");
  return ok;
}

static void a2a_body(int rank, int n) { all_to_all(rank, n); }
static void ordering_body(int rank, int arg) { (void)arg; ordering(rank); }
static void full_body(int rank, int arg) { (void)arg; full_ring(rank); }
static void leave_body(int rank, int closeFirst) { peer_leaves(rank, closeFirst); }
static void late_body(int rank, int arg) { (void)arg; late_registration(rank); }

int main(void) {
  // small rings, so that puts span many pieces and the ring fills
  setenv("GIN4J_LOOPBACK_SLOTS", "16", 1);
  setenv("GIN4J_LOOPBACK_SLOT_KIB", "64", 1);
  if (!getenv("GIN4J_LOOPBACK_DIR")) setenv("GIN4J_LOOPBACK_DIR", "/tmp", 1);
  g_shared = mmap(NULL, sizeof *g_shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int ok = 1;
  ok &= run("all-to-all, 2 ranks", 2, a2a_body, 2);
  ok &= run("all-to-all, 3 ranks", 3, a2a_body, 3);
  ok &= run("all-to-all, 4 ranks", 4, a2a_body, 4);
  ok &= run("signal after data, FIFO per pair", 2, ordering_body, 0);
  ok &= run("full ring", 2, full_body, 0);
  ok &= run("a put before its receiver registered", 2, late_body, 0);
  ok &= run("peer that leaves without closing", 2, leave_body, 0);
  ok &= run("peer that closes, then leaves", 2, leave_body, 1);
  printf("lb_core_test: %s\n", ok ? "all checks passed" : "FAILED");
  return ok ? 0 : 1;
}
