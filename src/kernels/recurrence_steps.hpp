#pragma once
// A whole-chain recurrence's steps (RecurrenceForward and RecurrenceBackward in ops.hpp): step k's
// cell arguments and the recurrent product's operands, shared by the Backend's definition (the
// steps one by one) and the CUDA kernel, so that both walk the chain alike.
#include "kernels/counter_hash.hpp"  // SF_HOST_DEVICE
#include "seqforge/backend/ops.hpp"

namespace seqforge::ref {

constexpr int64_t kLowBytes = 2;  // an element of the *_low copies: bf16 or f16

// p moved by `elements` of `size` bytes (null stays null).
SF_HOST_DEVICE inline const void* moved(const void* p, int64_t elements, int64_t size) {
  return p ? static_cast<const char*>(p) + elements * size : nullptr;
}
SF_HOST_DEVICE inline void* moved(void* p, int64_t elements, int64_t size) {
  return p ? static_cast<char*>(p) + elements * size : nullptr;
}

// Step k forward (time k, or steps-1-k in reverse): the cell's arguments, and the product's h
// (h_low where the cell writes one; h0 at the first step) with its row stride. `size`: bytes of
// the cell's dtype.
struct ForwardStep {
  CellForward cell;
  const void* h_prev;
  int64_t ld;
};
SF_HOST_DEVICE inline ForwardStep forward_step(const RecurrenceForward& a, int64_t k, int gates,
                                               int64_t size) {
  const CellForward& c0 = a.cell;
  const int64_t B = c0.batch, H = c0.hidden, GH = gates * H;
  const int64_t t = a.reverse ? a.steps - 1 - k : k, tp = a.reverse ? t + 1 : t - 1;
  ForwardStep s{c0, a.h0, a.ld_h0};
  CellForward& p = s.cell;
  p.gates = moved(c0.gates, t * B * GH, size);
  p.gates_low = moved(c0.gates_low, t * B * GH, kLowBytes);
  p.c = moved(c0.c, t * B * H, size);
  p.saved = moved(c0.saved, t * B * H, size);
  p.h = moved(c0.h, t * B * c0.ldh, size);
  p.h_low = moved(c0.h_low, t * B * c0.ldh, kLowBytes);
  p.x = moved(c0.x, t * B * c0.ldx, size);
  if (k > 0) {
    p.c_prev = moved(c0.c, tp * B * H, size);
    p.h_prev = moved(c0.h, tp * B * c0.ldh, size);
    p.ld_h_prev = c0.ldh;
    s.h_prev = c0.h_low ? moved(c0.h_low, tp * B * c0.ldh, kLowBytes) : p.h_prev;
    s.ld = c0.ldh;
  }
  return s;
}

// The time of step k back (the chain's last step first).
SF_HOST_DEVICE inline int64_t backward_time(const RecurrenceBackward& a, int64_t k) {
  return a.reverse ? k : a.steps - 1 - k;
}

// Step k back: the cell's arguments, dh carried in a.dh (and the direct term's, `direct`); dgates,
// dgates_rec and dbias as the caller gave them.
SF_HOST_DEVICE inline CellBackward backward_step(const RecurrenceBackward& a, int64_t k, int gates,
                                                 bool direct, int64_t size) {
  const CellBackward& c0 = a.cell;
  const int64_t B = c0.batch, H = c0.hidden, GH = gates * H;
  const int64_t t = backward_time(a, k), tp = a.reverse ? t + 1 : t - 1;
  CellBackward p = c0;
  p.gates = moved(c0.gates, t * B * GH, size);
  p.gates_low = moved(c0.gates_low, t * B * GH, kLowBytes);
  p.saved = moved(c0.saved, t * B * H, size);
  p.dh_out = moved(c0.dh_out, t * B * c0.ld_dh_out, size);
  p.dgates = moved(c0.dgates, t * B * GH, size);
  p.dgates_low = moved(c0.dgates_low, t * B * GH, kLowBytes);
  p.dgates_rec = moved(c0.dgates_rec, t * B * GH, size);
  p.dgates_rec_low = moved(c0.dgates_rec_low, t * B * GH, kLowBytes);
  if (t != (a.reverse ? a.steps - 1 : 0)) {  // not the chain's first step forward
    p.c_prev = moved(a.c, tp * B * H, size);
    p.h_prev = moved(a.h, tp * B * a.ldh, size);
    p.ld_h_prev = a.ldh;
  }
  p.dh_rec = a.dh;
  p.dh_direct = direct ? a.dh : nullptr;
  return p;
}

// dR at step k back, the product's operand: dgates_rec with `recurrent_grads`, else dgates (their
// low copies where given).
SF_HOST_DEVICE inline const void* recurrent_operand(const RecurrenceBackward& a, int64_t k,
                                                    int gates, bool recurrent_grads, int64_t size) {
  const CellBackward& c0 = a.cell;
  const void* low = recurrent_grads ? c0.dgates_rec_low : c0.dgates_low;
  const void* full = recurrent_grads ? c0.dgates_rec : c0.dgates;
  const int64_t offset = backward_time(a, k) * c0.batch * gates * c0.hidden;
  return low ? moved(low, offset, kLowBytes) : moved(full, offset, size);
}

}  // namespace seqforge::ref
