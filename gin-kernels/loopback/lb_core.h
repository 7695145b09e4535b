// lb_core.h - the loopback GIN transport's core: one-sided puts with signals between the processes
// of one machine, through shared-memory rings. A test transport for hosts without an RDMA device;
// its timings say nothing about a real network. No NCCL or CUDA types here: the NCCL plugin
// (lb_plugin.c) wraps it, and a CPU test (lb_core_test.c) drives it with host memory.
//
// Model: every rank creates one shared-memory segment holding one ring per source rank. A put from
// rank s to rank d is copied in pieces of at most one slot into ring s of d's segment by s's
// progress; d's progress copies each piece into its registered memory and applies the signal after
// the last piece. Each ring is FIFO and drained in order by one thread, so a signal becomes visible
// only after its own data and every earlier put from s to d (stronger than NCCL's per-context rule).
// A request completes when its source bytes are in the ring: the source may be reused (what NCCL's
// counters and flush mean). Registrations are symmetric: every rank registers in the same order, so
// the k-th registration of one rank corresponds to the k-th of every other.
#ifndef GIN4J_LB_CORE_H
#define GIN4J_LB_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LB_MAX_RANKS 256

enum { LB_OK = 0, LB_EINVAL = 1, LB_ESYS = 2, LB_EPEER = 3 };    // results
enum { LB_MEM_HOST = 1, LB_MEM_DEVICE = 2 };                     // memory kinds
enum { LB_SIGNAL_NONE = 0, LB_SIGNAL_INC = 1, LB_SIGNAL_ADD = 2 };

// What this rank publishes for the others (NCCL all-gathers it); fits NCCL's 128-byte handle.
typedef struct {
  uint32_t magic, version;
  int32_t pid;
  uint32_t slots, slotBytes;
  uint32_t pad;
  uint64_t nonce;
  char dir[88];
} lb_handle;

// How bytes move; the plugin copies with CUDA, the CPU test with memcpy. Each call returns LB_OK
// once its copy is complete (visible to the next call), or an error it has already logged.
typedef struct {
  void* ctx;
  int (*to_ring)(void* ctx, void* ring, const void* src, int srcKind, size_t n);
  int (*from_ring)(void* ctx, void* dst, int dstKind, const void* ring, size_t n);
  // adds value to the 64-bit word at addr, ordered after every earlier from_ring
  int (*signal_add)(void* ctx, uint64_t* addr, int kind, uint64_t value);
  // optional: make a ring mapping fast to copy from/to (pinning); failures only cost speed
  void (*map_hook)(void* ctx, void* base, size_t size, int mapped);
} lb_ops;

typedef struct {
  uint64_t puts, signals, bytes;   // sent to the peer: puts (calls naming a destination), signals, payload bytes
  uint64_t putsIn, signalsIn, bytesIn;
} lb_stats;

typedef struct lb_comm lb_comm;
typedef struct lb_reg lb_reg;
typedef struct lb_request lb_request;

// Log sink: level 0 error, 1 warning, 2 info. Default: stderr.
typedef void (*lb_log_fn)(int level, const char* msg);
void lb_set_log(lb_log_fn fn);

// Fills this process's handle; slots / slotBytes / dir come from the environment
// (GIN4J_LOOPBACK_SLOTS, GIN4J_LOOPBACK_SLOT_KIB, GIN4J_LOOPBACK_DIR) or defaults.
int lb_listen(lb_handle* out);
// Creates this rank's segment and the comm. Never waits for a peer: peers' segments are mapped
// when they appear.
int lb_connect(const lb_handle* handles, int nranks, int rank, const lb_ops* ops, lb_comm** out);
int lb_register(lb_comm* c, void* base, size_t size, int kind, lb_reg** out);
int lb_deregister(lb_comm* c, lb_reg* r);
// Queues a put of size bytes (0 allowed) from src+srcOff to the peer's counterpart of dst at
// dstOff; with sig != NULL and sigOp != LB_SIGNAL_NONE, then the signal at the peer's counterpart
// of sig at sigOff (src and dst may be NULL for a signal alone). Never blocks.
int lb_put(lb_comm* c, int peer, lb_reg* src, uint64_t srcOff, size_t size, lb_reg* dst, uint64_t dstOff,
           lb_reg* sig, uint64_t sigOff, int sigOp, uint64_t sigValue, lb_request** out);
// done = 1 once the request's source bytes are in the ring, or at once with the error after the
// comm has failed (a peer gone, say): an error completion. The request is freed then.
int lb_test(lb_comm* c, lb_request* r, int* done);
// Moves what can move now: pending pieces into peers' rings, this rank's rings into its memory.
// Never waits for a peer; an error (a peer gone, a bad piece) is logged and sticks.
int lb_progress(lb_comm* c);
int lb_close(lb_comm* c);
// Names the copy or launch this process's transport is in (NULL when none), for the state report
// that GIN4J_LOOPBACK_TRACE=1 prints every second.
void lb_note_op(const char* what);
// Totals of this process with `peer`, over every comm so far.
void lb_stats_of(int peer, lb_stats* out);

#ifdef __cplusplus
}
#endif
#endif
