// moe/trace_slots.cuh - the named points of GIN_TRACE in the dispatch (kernel 0) and the combine
// (kernel 1). Roles share slot numbers where they never share a block.
#pragma once

#include "../include/gin_trace.cuh"

enum MoeTraceSlot : int {
  // dispatch, every block
  MOE_TRACE_DISPATCH_START = 0,            // the role's first step (after the prologue)
  MOE_TRACE_DISPATCH_ENTRY = 10,           // entry, before the checks and the prologue's loads
  MOE_TRACE_DISPATCH_PROLOGUE = 23,        // checks and layouts done (before the prologue's barrier)
  // layout-path sender
  MOE_TRACE_SENDER_ROUTED = 1,             // routing counted (and positions written, small layout)
  MOE_TRACE_SENDER_OFFSETS = 2,            // start offsets known
  MOE_TRACE_SENDER_TABLES = 3,             // leader: count tables stored
  MOE_TRACE_SENDER_POSITIONS = 4,          // positions released
  MOE_TRACE_SENDER_SENT = 5,               // remote slots sent (token path too)
  MOE_TRACE_SENDER_JOINS_OWN = 6,          // tables read: joins the own items
  MOE_TRACE_SENDER_END = 7,                // own items done, end
  MOE_TRACE_SMALL_LAYOUT_CLEARED = 8,      // small layout: counters cleared
  MOE_TRACE_SMALL_LAYOUT_WALKED = 9,       // small layout: ids walked
  MOE_TRACE_SENDER_QUANTIZED = 13,         // thread 0's warp quantized its share of the fp8 rows
  // token-path sender
  MOE_TRACE_TP_SENDER_SENDS = 11,          // ids pushed, destinations known: the sends start
  MOE_TRACE_TP_SENDER_END = 12,            // tokenPos and chanStartTo written, end
  MOE_TRACE_TP_SENDER_IDS = 16,            // thread 0's token's ids out (before the barrier)
  // receivers
  MOE_TRACE_RECEIVER_TABLES = 1,           // count tables read
  MOE_TRACE_RECEIVER_FIRST_REMOTE = 2,     // warp 0's first remote item landed
  MOE_TRACE_RECEIVER_END = 3,              // remote and claimed own items done, end
  MOE_TRACE_TP_RECEIVER_LAYOUT = 11,       // token path: layout done (scan, items)
  MOE_TRACE_TP_RECEIVER_QUANT_SEEN = 14,   // token path: warp 0 saw sender c's fp8 rows
  MOE_TRACE_RECEIVER_QUANTIZED = 15,       // layout path: its share of the fp8 rows released
  MOE_TRACE_TP_WALK_CLEARED = 17,          // token path: counters cleared
  MOE_TRACE_TP_WALK_FIRST = 18,            // token path: thread 0's first (own) tokens counted
  MOE_TRACE_TP_WALK_COUNTED = 19,          // token path: thread 0's tokens counted
  MOE_TRACE_TP_WALK_DONE = 20,             // token path: every source's ids walked
  MOE_TRACE_TP_RECEIVER_FIRST_OWN = 21,    // token path: warp 0's first own item copied
  // combine
  MOE_TRACE_COMBINE_START = GIN_TRACE_SLOTS + 0,   // after the prologue
  MOE_TRACE_PRODUCER_SENT = GIN_TRACE_SLOTS + 1,   // producer: partials sent
  MOE_TRACE_CONSUMER_FIRST = GIN_TRACE_SLOTS + 1,  // consumer: warp 0's first partials landed
  MOE_TRACE_CONSUMER_END = GIN_TRACE_SLOTS + 2,    // consumer: y done
  MOE_TRACE_COMBINE_ENTRY = GIN_TRACE_SLOTS + 10,  // entry, before the prologue
};
