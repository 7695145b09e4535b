// lb_core.c - rings, registrations and progress of the loopback GIN transport (lb_core.h).
#define _GNU_SOURCE
#include "lb_core.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define LB_MAGIC 0x6734626cu  // "lb4g"
#define LB_VERSION 1
#define LB_DEFAULT_SLOTS 16
#define LB_DEFAULT_SLOT_KIB 256
#define LB_LIVENESS_NS 100000000ull  // how often peers' processes are checked (100 ms)
#define LB_REG_WAIT_NS 10000000000ull  // how long a piece may wait for this rank's counterpart registration (10 s)

enum { PIECE_PUT = 1, PIECE_SIGNAL_ONLY = 2 };

// One ring per (source, this rank): head written by the source only, tail by this rank only.
typedef struct {
  _Atomic uint64_t head;
  char pad0[56];
  _Atomic uint64_t tail;
  char pad1[56];
} ring_ctl;

typedef struct {
  uint32_t kind, last;           // last: the final piece of its put (carries the signal)
  uint64_t regId, regSize;       // destination registration as the source numbers it, and its size
  uint64_t dstOff, size;
  uint64_t sigRegId, sigRegSize, sigOff, sigValue;
  uint32_t sigOp, pad;
} piece_hdr;                      // 80 bytes, slots start 128-byte aligned

typedef struct {
  uint32_t magic, version;
  uint32_t nranks, slots, slotBytes, pad;
  _Atomic uint32_t ready;         // set once the rings are initialised
  _Atomic uint32_t closed;        // set by lb_close: a peer that then exits is not an error
  char pad1[128 - 32];
} seg_hdr;

struct lb_reg {
  uint64_t id;                    // 1-based registration number: equal on every rank
  char* base;
  size_t size;
  int kind, live;
};

struct lb_request {
  lb_request* next;
  int peer;
  lb_reg* src;
  uint64_t srcOff, size, sent;
  uint64_t dstId, dstSize, dstOff;
  uint64_t sigId, sigSize, sigOff, sigValue;
  int sigOp, started, done;
};

typedef struct {
  int pid;
  char path[160];
  seg_hdr* seg;                   // mapped once it exists (lazily)
  size_t segBytes;
  lb_request *pendHead, *pendTail;
  uint64_t regWaitSince;          // when the head of this peer's ring began to wait for a registration
} peer_state;

struct lb_comm {
  int rank, nranks;
  uint32_t slots, slotBytes;
  size_t slotStride, ringBytes, segBytes;
  lb_ops ops;
  char ownPath[160];
  seg_hdr* own;
  peer_state* peers;
  pthread_mutex_t lock;           // registrations: changed by the user's thread, read by progress
  lb_reg** regs;
  size_t nregs, capRegs;
  int error;                      // sticky
  uint64_t lastLiveness;
  // GIN4J_LOOPBACK_TRACE=1: a thread reports the transport's state every second (a diagnosis aid)
  _Atomic uint64_t progressCalls, lastProgressNs, pending, sentPieces, drainedPieces, signalsApplied;
  _Atomic int stopTrace;
  pthread_t traceThread;
  int tracing;
};

static lb_stats g_stats[LB_MAX_RANKS];
static pthread_mutex_t g_stats_lock = PTHREAD_MUTEX_INITIALIZER;

static void default_log(int level, const char* msg) {
  fprintf(stderr, "gin4j-loopback %s: %s\n", level == 0 ? "error" : level == 1 ? "warning" : "info", msg);
}
static lb_log_fn g_log = default_log;
void lb_set_log(lb_log_fn fn) { g_log = fn ? fn : default_log; }

static void logf_(int level, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_log(level, buf);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static _Atomic(const char*) g_op;
static _Atomic uint64_t g_opStart;

void lb_note_op(const char* what) {
  if (what) atomic_store(&g_opStart, now_ns());
  atomic_store(&g_op, what);
}

static double ms_since(uint64_t t) {
  uint64_t now = now_ns();
  return now > t ? (now - t) / 1e6 : 0.0;  // t may be a touch newer than this thread's clock read
}

static int trace_on(void) {
  const char* v = getenv("GIN4J_LOOPBACK_TRACE");
  return v && *v && strcmp(v, "0") != 0;
}

// Every second while tracing: progress calls and how long ago the last one ran, requests not yet in
// a peer's ring, pieces sent / drained, signals applied, and each ring's head and tail. A put that
// never completes shows here as pending > 0 with a ring that does not move.
static void* trace_main(void* arg) {
  lb_comm* c = (lb_comm*)arg;
  while (!atomic_load(&c->stopTrace)) {
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    if (atomic_load(&c->stopTrace)) break;
    char buf[480];
    int n = snprintf(buf, sizeof buf, "trace rank %d: %llu progress calls (last %.1f ms ago), %llu requests pending, %llu pieces sent, "
                     "%llu drained, %llu signals applied, error %d; rings in/out:", c->rank,
                     (unsigned long long)atomic_load(&c->progressCalls),
                     ms_since(atomic_load(&c->lastProgressNs)), (unsigned long long)atomic_load(&c->pending),
                     (unsigned long long)atomic_load(&c->sentPieces), (unsigned long long)atomic_load(&c->drainedPieces),
                     (unsigned long long)atomic_load(&c->signalsApplied), c->error);
    for (int p = 0; p < c->nranks && n < (int)sizeof buf - 64; p++) {
      if (p == c->rank) continue;
      ring_ctl* in = (ring_ctl*)((char*)c->own + sizeof(seg_hdr) + (size_t)p * c->ringBytes);
      seg_hdr* peer = c->peers[p].seg;
      ring_ctl* out = peer ? (ring_ctl*)((char*)peer + sizeof(seg_hdr) + (size_t)c->rank * c->ringBytes) : NULL;
      n += snprintf(buf + n, sizeof buf - n, " [%d] %llu/%llu %llu/%llu", p, (unsigned long long)atomic_load(&in->head),
                    (unsigned long long)atomic_load(&in->tail), out ? (unsigned long long)atomic_load(&out->head) : 0ull,
                    out ? (unsigned long long)atomic_load(&out->tail) : 0ull);
    }
    const char* op = atomic_load(&g_op);
    if (op) n += snprintf(buf + n, sizeof buf - n, "; in %s for %.1f ms", op, ms_since(atomic_load(&g_opStart)));
    fprintf(stderr, "gin4j-loopback %s\n", buf);
  }
  return NULL;
}

static long env_long(const char* name, long dflt, long lo, long hi) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end;
  long x = strtol(v, &end, 10);
  if (*end || x < lo || x > hi) {
    logf_(1, "%s=%s is not a whole number in [%ld, %ld]; using %ld", name, v, lo, hi, dflt);
    return dflt;
  }
  return x;
}

static size_t ring_bytes(uint32_t slots, uint32_t slotBytes, size_t* stride) {
  size_t s = (sizeof(piece_hdr) + (size_t)slotBytes + 127) & ~(size_t)127;
  if (stride) *stride = s;
  return sizeof(ring_ctl) + (size_t)slots * s;
}
static size_t seg_bytes(int nranks, uint32_t slots, uint32_t slotBytes) {
  return sizeof(seg_hdr) + (size_t)nranks * ring_bytes(slots, slotBytes, NULL);
}
static ring_ctl* ring_of(lb_comm* c, seg_hdr* seg, int source) {
  return (ring_ctl*)((char*)seg + sizeof(seg_hdr) + (size_t)source * c->ringBytes);
}
static char* slot_of(lb_comm* c, ring_ctl* ring, uint64_t index) {
  return (char*)ring + sizeof(ring_ctl) + (size_t)(index % c->slots) * c->slotStride;
}

static void seg_path(char* out, size_t cap, const lb_handle* h) {
  snprintf(out, cap, "%s/gin4j-loopback-%d-%016llx", h->dir, h->pid, (unsigned long long)h->nonce);
}

int lb_listen(lb_handle* out) {
  memset(out, 0, sizeof *out);
  out->magic = LB_MAGIC;
  out->version = LB_VERSION;
  out->pid = (int32_t)getpid();
  out->slots = (uint32_t)env_long("GIN4J_LOOPBACK_SLOTS", LB_DEFAULT_SLOTS, 2, 1 << 16);
  out->slotBytes = (uint32_t)env_long("GIN4J_LOOPBACK_SLOT_KIB", LB_DEFAULT_SLOT_KIB, 4, 1 << 20) * 1024u;
  uint64_t n = now_ns() ^ ((uint64_t)getpid() << 40);
  int fd = open("/dev/urandom", O_RDONLY);
  if (fd >= 0) {
    uint64_t r;
    if (read(fd, &r, sizeof r) == (ssize_t)sizeof r) n ^= r;
    close(fd);
  }
  out->nonce = n;
  const char* dir = getenv("GIN4J_LOOPBACK_DIR");
  if (!dir || !*dir) dir = "/dev/shm";
  if (strlen(dir) >= sizeof out->dir) {
    logf_(0, "GIN4J_LOOPBACK_DIR is %zu characters long; at most %zu fit the handle", strlen(dir), sizeof out->dir - 1);
    return LB_EINVAL;
  }
  strcpy(out->dir, dir);
  return LB_OK;
}

static int map_peer(lb_comm* c, int p) {
  peer_state* ps = &c->peers[p];
  if (ps->seg) return 1;
  int fd = open(ps->path, O_RDWR);
  if (fd < 0) return 0;  // not created yet
  struct stat st;
  int ok = fstat(fd, &st) == 0 && (size_t)st.st_size >= ps->segBytes;
  void* m = ok ? mmap(NULL, ps->segBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (m == MAP_FAILED) return 0;
  seg_hdr* h = (seg_hdr*)m;
  if (atomic_load_explicit(&h->ready, memory_order_acquire) != 1) {
    munmap(m, ps->segBytes);
    return 0;
  }
  if (h->magic != LB_MAGIC || h->version != LB_VERSION || h->nranks != (uint32_t)c->nranks) {
    logf_(0, "%s is not rank %d's segment of this group (magic %#x version %u ranks %u; expected %#x, %u, %d)",
          ps->path, p, h->magic, h->version, h->nranks, LB_MAGIC, LB_VERSION, c->nranks);
    munmap(m, ps->segBytes);
    c->error = LB_EINVAL;
    return 0;
  }
  if (c->ops.map_hook) c->ops.map_hook(c->ops.ctx, m, ps->segBytes, 1);
  ps->seg = h;
  return 1;
}

int lb_connect(const lb_handle* handles, int nranks, int rank, const lb_ops* ops, lb_comm** out) {
  *out = NULL;
  if (nranks < 1 || nranks > LB_MAX_RANKS || rank < 0 || rank >= nranks) {
    logf_(0, "connect: rank %d of %d ranks; this transport takes 1 to %d ranks", rank, nranks, LB_MAX_RANKS);
    return LB_EINVAL;
  }
  const lb_handle* me = &handles[rank];
  for (int r = 0; r < nranks; r++) {
    const lb_handle* h = &handles[r];
    if (h->magic != LB_MAGIC || h->version != LB_VERSION) {
      logf_(0, "connect: rank %d's handle is not a gin4j loopback handle of version %d (magic %#x, version %u)",
            r, LB_VERSION, h->magic, h->version);
      return LB_EINVAL;
    }
    if (h->slots != me->slots || h->slotBytes != me->slotBytes) {
      logf_(0, "connect: rank %d has %u slots of %u bytes, rank %d %u of %u: set GIN4J_LOOPBACK_SLOTS and "
            "GIN4J_LOOPBACK_SLOT_KIB alike on every rank", r, h->slots, h->slotBytes, rank, me->slots, me->slotBytes);
      return LB_EINVAL;
    }
  }
  lb_comm* c = calloc(1, sizeof *c);
  if (!c) return LB_ESYS;
  c->rank = rank;
  c->nranks = nranks;
  c->slots = me->slots;
  c->slotBytes = me->slotBytes;
  c->ringBytes = ring_bytes(c->slots, c->slotBytes, &c->slotStride);
  c->segBytes = seg_bytes(nranks, c->slots, c->slotBytes);
  c->ops = *ops;
  pthread_mutex_init(&c->lock, NULL);
  c->peers = calloc((size_t)nranks, sizeof *c->peers);
  if (!c->peers) { free(c); return LB_ESYS; }
  for (int r = 0; r < nranks; r++) {
    c->peers[r].pid = handles[r].pid;
    c->peers[r].segBytes = c->segBytes;
    seg_path(c->peers[r].path, sizeof c->peers[r].path, &handles[r]);
  }
  seg_path(c->ownPath, sizeof c->ownPath, me);

  struct statvfs vfs;
  if (statvfs(me->dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < c->segBytes) {
    logf_(0, "connect: %s has %llu bytes free, rank %d's rings need %zu (%d ranks x %u slots x %u bytes): "
          "point GIN4J_LOOPBACK_DIR at a larger folder or lower GIN4J_LOOPBACK_SLOTS / GIN4J_LOOPBACK_SLOT_KIB",
          me->dir, (unsigned long long)vfs.f_bavail * vfs.f_frsize, rank, c->segBytes, nranks, c->slots, c->slotBytes);
    lb_close(c);
    return LB_ESYS;
  }
  int fd = open(c->ownPath, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    logf_(0, "connect: cannot create %s: %s", c->ownPath, strerror(errno));
    lb_close(c);
    return LB_ESYS;
  }
  int e = posix_fallocate(fd, 0, (off_t)c->segBytes);  // fails now, not as SIGBUS later, when the folder is full
  void* m = e == 0 ? mmap(NULL, c->segBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (e == 0 && m == MAP_FAILED) e = errno;
  close(fd);
  if (m == MAP_FAILED) {
    logf_(0, "connect: cannot size or map %s (%zu bytes): %s", c->ownPath, c->segBytes, strerror(e));
    unlink(c->ownPath);
    lb_close(c);
    return LB_ESYS;
  }
  c->own = (seg_hdr*)m;
  c->own->magic = LB_MAGIC;
  c->own->version = LB_VERSION;
  c->own->nranks = (uint32_t)nranks;
  c->own->slots = c->slots;
  c->own->slotBytes = c->slotBytes;
  if (c->ops.map_hook) c->ops.map_hook(c->ops.ctx, m, c->segBytes, 1);
  atomic_store_explicit(&c->own->ready, 1, memory_order_release);
  c->peers[rank].seg = c->own;  // puts to oneself go through one's own ring
  c->tracing = trace_on() && pthread_create(&c->traceThread, NULL, trace_main, c) == 0;
  *out = c;
  return LB_OK;
}

int lb_register(lb_comm* c, void* base, size_t size, int kind, lb_reg** out) {
  *out = NULL;
  if ((kind != LB_MEM_HOST && kind != LB_MEM_DEVICE) || (base == NULL && size > 0)) {
    logf_(0, "register: memory %p of %zu bytes, kind %d (expected host %d or device %d)", base, size, kind, LB_MEM_HOST, LB_MEM_DEVICE);
    return LB_EINVAL;
  }
  lb_reg* r = calloc(1, sizeof *r);
  if (!r) return LB_ESYS;
  pthread_mutex_lock(&c->lock);
  if (c->nregs == c->capRegs) {
    size_t cap = c->capRegs ? 2 * c->capRegs : 64;
    lb_reg** grown = realloc(c->regs, cap * sizeof *grown);
    if (!grown) { pthread_mutex_unlock(&c->lock); free(r); return LB_ESYS; }
    c->regs = grown;
    c->capRegs = cap;
  }
  r->id = c->nregs + 1;
  r->base = base;
  r->size = size;
  r->kind = kind;
  r->live = 1;
  c->regs[c->nregs++] = r;
  pthread_mutex_unlock(&c->lock);
  *out = r;
  return LB_OK;
}

int lb_deregister(lb_comm* c, lb_reg* r) {
  if (!r) return LB_OK;
  pthread_mutex_lock(&c->lock);
  int found = r->id >= 1 && r->id <= c->nregs && c->regs[r->id - 1] == r && r->live;
  if (found) r->live = 0;  // the number stays taken: later registrations keep matching their peers'
  pthread_mutex_unlock(&c->lock);
  if (!found) {
    logf_(0, "deregister: %p is not a live registration of this comm", (void*)r);
    return LB_EINVAL;
  }
  return LB_OK;
}

// The registration `id` of this rank, checked against the size the source saw.
// The registration a piece names, or NULL: *notYet = 1 (nothing logged) when this rank has not made
// that many registrations yet. Registration is collective, but a rank may return from it, and put,
// before a slower rank has registered its own counterpart.
static lb_reg* resolve(lb_comm* c, uint64_t id, uint64_t size, uint64_t off, uint64_t n, int source, const char* what, int* notYet) {
  pthread_mutex_lock(&c->lock);
  lb_reg* r = id >= 1 && id <= c->nregs ? c->regs[id - 1] : NULL;
  *notYet = id > c->nregs;
  pthread_mutex_unlock(&c->lock);
  if (*notYet) return NULL;
  if (!r || !r->live) {
    logf_(0, "rank %d: a %s from rank %d names registration %llu, which this rank does not have (every rank must "
          "register its windows in the same order)", c->rank, what, source, (unsigned long long)id);
    return NULL;
  }
  if (r->size != size || off > r->size || n > r->size - off) {
    logf_(0, "rank %d: a %s from rank %d writes [%llu, %llu) of registration %llu, which has %zu bytes here and %llu at "
          "the source", c->rank, what, source, (unsigned long long)off, (unsigned long long)(off + n),
          (unsigned long long)id, r->size, (unsigned long long)size);
    return NULL;
  }
  return r;
}

static void count(int peer, uint64_t puts, uint64_t signals, uint64_t bytes, int incoming) {
  if (peer < 0 || peer >= LB_MAX_RANKS) return;
  pthread_mutex_lock(&g_stats_lock);
  lb_stats* s = &g_stats[peer];
  if (incoming) { s->putsIn += puts; s->signalsIn += signals; s->bytesIn += bytes; }
  else { s->puts += puts; s->signals += signals; s->bytes += bytes; }
  pthread_mutex_unlock(&g_stats_lock);
}

void lb_stats_of(int peer, lb_stats* out) {
  memset(out, 0, sizeof *out);
  if (peer < 0 || peer >= LB_MAX_RANKS) return;
  pthread_mutex_lock(&g_stats_lock);
  *out = g_stats[peer];
  pthread_mutex_unlock(&g_stats_lock);
}

int lb_put(lb_comm* c, int peer, lb_reg* src, uint64_t srcOff, size_t size, lb_reg* dst, uint64_t dstOff,
           lb_reg* sig, uint64_t sigOff, int sigOp, uint64_t sigValue, lb_request** out) {
  *out = NULL;
  if (c->error) return c->error;
  int hasSignal = sig != NULL && sigOp != LB_SIGNAL_NONE;
  int ok = peer >= 0 && peer < c->nranks && (sigOp == LB_SIGNAL_NONE || sigOp == LB_SIGNAL_INC || sigOp == LB_SIGNAL_ADD);
  if (ok && size > 0) ok = src && dst && src->live && dst->live && srcOff <= src->size && size <= src->size - srcOff &&
                           dstOff <= dst->size && size <= dst->size - dstOff;
  if (ok && size == 0) ok = hasSignal || dst != NULL;
  if (ok && hasSignal) ok = sig->live && sigOff <= sig->size && 8 <= sig->size - sigOff && (sigOff & 7) == 0;
  if (!ok) {
    logf_(0, "put: rank %d -> peer %d of %d: %zu bytes from [%llu of %zu] to [%llu of %zu], signal op %d at %llu of %zu: "
          "out of range, unregistered or unknown", c->rank, peer, c->nranks, size, (unsigned long long)srcOff,
          src ? src->size : 0, (unsigned long long)dstOff, dst ? dst->size : 0, sigOp, (unsigned long long)sigOff,
          sig ? sig->size : 0);
    return LB_EINVAL;
  }
  lb_request* r = calloc(1, sizeof *r);
  if (!r) return LB_ESYS;
  r->peer = peer;
  r->src = src;
  r->srcOff = srcOff;
  r->size = size;
  r->dstId = dst ? dst->id : 0;
  r->dstSize = dst ? dst->size : 0;
  r->dstOff = dstOff;
  if (hasSignal) {
    r->sigId = sig->id;
    r->sigSize = sig->size;
    r->sigOff = sigOff;
    r->sigOp = sigOp;
    r->sigValue = sigOp == LB_SIGNAL_INC ? 1 : sigValue;
  }
  peer_state* ps = &c->peers[peer];
  if (ps->pendTail) ps->pendTail->next = r; else ps->pendHead = r;
  ps->pendTail = r;
  atomic_fetch_add(&c->pending, 1);
  count(peer, dst ? 1 : 0, hasSignal ? 1 : 0, size, 0);
  *out = r;
  return LB_OK;
}

int lb_test(lb_comm* c, lb_request* r, int* done) {
  *done = 0;
  if (!r) return LB_EINVAL;
  if (r->done) {
    *done = 1;
    free(r);
    return LB_OK;
  }
  if (c->error) {
    // an error completion, as a NIC gives: the put will never be made, and NCCL's flush and
    // counters (which look at done only) must not wait for it forever
    peer_state* ps = &c->peers[r->peer];
    lb_request** link = &ps->pendHead;
    lb_request* prev = NULL;
    while (*link && *link != r) { prev = *link; link = &(*link)->next; }
    if (*link) {
      *link = r->next;
      if (ps->pendTail == r) ps->pendTail = prev;
      atomic_fetch_sub(&c->pending, 1);
    }
    free(r);
    *done = 1;
  }
  return c->error;
}

// Pending pieces for peer p into ring `rank` of p's segment, as far as the ring has room.
static int send_to(lb_comm* c, int p) {
  peer_state* ps = &c->peers[p];
  if (!ps->pendHead) return LB_OK;
  if (!map_peer(c, p)) return c->error;
  ring_ctl* ring = ring_of(c, ps->seg, c->rank);
  uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
  while (ps->pendHead) {
    uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_acquire);
    if (head - tail >= c->slots) break;  // full: the peer's progress frees slots
    lb_request* r = ps->pendHead;
    uint64_t n = r->size - r->sent;
    if (n > c->slotBytes) n = c->slotBytes;
    char* slot = slot_of(c, ring, head);
    piece_hdr* h = (piece_hdr*)slot;
    memset(h, 0, sizeof *h);
    h->kind = r->dstId ? PIECE_PUT : PIECE_SIGNAL_ONLY;
    h->regId = r->dstId;
    h->regSize = r->dstSize;
    h->dstOff = r->dstOff + r->sent;
    h->size = n;
    h->last = r->sent + n == r->size;
    if (h->last && r->sigOp != LB_SIGNAL_NONE) {
      h->sigOp = (uint32_t)r->sigOp;
      h->sigRegId = r->sigId;
      h->sigRegSize = r->sigSize;
      h->sigOff = r->sigOff;
      h->sigValue = r->sigValue;
    }
    if (n > 0) {
      int e = c->ops.to_ring(c->ops.ctx, slot + sizeof(piece_hdr), r->src->base + r->srcOff + r->sent, r->src->kind, n);
      if (e) return c->error = e;
    }
    atomic_store_explicit(&ring->head, ++head, memory_order_release);
    atomic_fetch_add(&c->sentPieces, 1);
    r->sent += n;
    if (h->last) {
      atomic_fetch_sub(&c->pending, 1);
      ps->pendHead = r->next;
      if (!ps->pendHead) ps->pendTail = NULL;
      r->done = 1;  // source consumed: freed by lb_test
    }
  }
  return LB_OK;
}

// Ring `source` of this rank's segment into registered memory, in order.
static int drain_from(lb_comm* c, int source) {
  ring_ctl* ring = ring_of(c, c->own, source);
  uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
  while (tail < head) {
    char* slot = slot_of(c, ring, tail);
    piece_hdr h = *(piece_hdr*)slot;
    if (h.size > c->slotBytes || (h.kind != PIECE_PUT && h.kind != PIECE_SIGNAL_ONLY)) {
      logf_(0, "rank %d: piece %llu from rank %d is malformed (kind %u, %llu bytes, slots hold %u)", c->rank,
            (unsigned long long)tail, source, h.kind, (unsigned long long)h.size, c->slotBytes);
      return c->error = LB_EINVAL;
    }
    int notYet = 0;
    lb_reg* dst = NULL;
    lb_reg* sig = NULL;
    if (h.kind == PIECE_PUT) dst = resolve(c, h.regId, h.regSize, h.dstOff, h.size, source, "put", &notYet);
    if (!notYet && h.last && h.sigOp != LB_SIGNAL_NONE) sig = resolve(c, h.sigRegId, h.sigRegSize, h.sigOff, 8, source, "signal", &notYet);
    if (notYet) {  // the piece waits in the ring (and the ring behind it) until this rank registers
      peer_state* ps = &c->peers[source];
      uint64_t t = now_ns();
      if (!ps->regWaitSince) ps->regWaitSince = t;
      if (t - ps->regWaitSince < LB_REG_WAIT_NS) return LB_OK;
      logf_(0, "rank %d: piece %llu from rank %d names registration %llu (signal %llu); this rank still has only %zu registrations after %llu s "
            "(every rank must register its windows in the same order)", c->rank, (unsigned long long)tail, source,
            (unsigned long long)h.regId, (unsigned long long)h.sigRegId, c->nregs, (unsigned long long)(LB_REG_WAIT_NS / 1000000000ull));
      return c->error = LB_EINVAL;
    }
    c->peers[source].regWaitSince = 0;
    if (h.kind == PIECE_PUT) {
      if (!dst) return c->error = LB_EINVAL;
      if (h.size > 0) {
        int e = c->ops.from_ring(c->ops.ctx, dst->base + h.dstOff, dst->kind, slot + sizeof(piece_hdr), h.size);
        if (e) return c->error = e;
      }
    }
    int signalled = h.last && h.sigOp != LB_SIGNAL_NONE;
    if (signalled) {
      if (!sig) return c->error = LB_EINVAL;
      int e = c->ops.signal_add(c->ops.ctx, (uint64_t*)(sig->base + h.sigOff), sig->kind, h.sigValue);
      if (e) return c->error = e;
      atomic_fetch_add(&c->signalsApplied, 1);
    }
    atomic_store_explicit(&ring->tail, ++tail, memory_order_release);
    atomic_fetch_add(&c->drainedPieces, 1);
    count(source, h.kind == PIECE_PUT && h.last ? 1 : 0, signalled ? 1 : 0, h.size, 1);
    head = atomic_load_explicit(&ring->head, memory_order_acquire);
  }
  return LB_OK;
}

// Whether pid runs: a process that exited but was not reaped yet (a zombie) counts as gone.
static int process_alive(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 1;  // no /proc: trust kill
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 1;
  buf[n] = 0;
  const char* paren = strrchr(buf, ')');  // "pid (name) S ...": the name may hold spaces
  return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

// A peer whose process is gone without closing, or that closed with puts to it still pending:
// those puts, and every signal from it, would never come. Checked every LB_LIVENESS_NS; peers'
// segments are mapped here too, so that their closed marks can be read once they have left.
static int check_peers(lb_comm* c) {
  uint64_t t = now_ns();
  if (t - c->lastLiveness < LB_LIVENESS_NS) return LB_OK;
  c->lastLiveness = t;
  for (int p = 0; p < c->nranks; p++) {
    if (p == c->rank) continue;
    peer_state* ps = &c->peers[p];
    map_peer(c, p);
    int closed = ps->seg && atomic_load_explicit(&ps->seg->closed, memory_order_acquire);
    if (closed && ps->pendHead) {
      logf_(0, "rank %d: peer rank %d (process %d) closed its GIN connection while puts to it were pending", c->rank, p, ps->pid);
      return c->error = LB_EPEER;
    }
    if (closed || process_alive(ps->pid)) continue;
    logf_(0, "rank %d: peer rank %d (process %d) is gone without closing its GIN connection", c->rank, p, ps->pid);
    return c->error = LB_EPEER;
  }
  return c->error;
}

int lb_progress(lb_comm* c) {
  atomic_fetch_add_explicit(&c->progressCalls, 1, memory_order_relaxed);
  atomic_store_explicit(&c->lastProgressNs, now_ns(), memory_order_relaxed);
  if (c->error) return c->error;
  for (int p = 0; p < c->nranks; p++) {
    int e = send_to(c, p);
    if (!e) e = drain_from(c, p);
    if (e) return e;
  }
  return check_peers(c);
}

int lb_close(lb_comm* c) {
  if (!c) return LB_OK;
  if (c->tracing) {
    atomic_store(&c->stopTrace, 1);
    pthread_join(c->traceThread, NULL);
  }
  if (c->own) atomic_store_explicit(&c->own->closed, 1, memory_order_release);
  for (int p = 0; c->peers && p < c->nranks; p++) {
    peer_state* ps = &c->peers[p];
    for (lb_request* r = ps->pendHead; r;) { lb_request* n = r->next; free(r); r = n; }
    if (ps->seg && p != c->rank) {
      if (c->ops.map_hook) c->ops.map_hook(c->ops.ctx, ps->seg, ps->segBytes, 0);
      munmap(ps->seg, ps->segBytes);
    }
  }
  if (c->own) {
    if (c->ops.map_hook) c->ops.map_hook(c->ops.ctx, c->own, c->segBytes, 0);
    munmap(c->own, c->segBytes);
    unlink(c->ownPath);
  }
  for (size_t i = 0; i < c->nregs; i++) free(c->regs[i]);
  free(c->regs);
  free(c->peers);
  pthread_mutex_destroy(&c->lock);
  free(c);
  return LB_OK;
}
