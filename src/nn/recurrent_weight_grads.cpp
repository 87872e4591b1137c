// The recurrence engine's weight gradients: dW_ih += dG^T in and dW_hh += dR^T h_prev over the
// steps of a chain, as GEMMs on the row-major buffers or on K-major copies of them, whichever
// runs faster (timed on first use, cached), after the step loop or a chunk at a time inside it;
// and the bias and the cells' own parameters' gradients the backward cells summed.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include <algorithm>
#include <cstdio>
#include <string>

#include "nn/recurrent_util.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/nn/recurrent.hpp"

namespace seqforge {

using recurrent::at;
using recurrent::upper;

namespace {

// Weight-gradient GEMMs with fewer rows of K (steps times batch) lose more to K-major copies, and
// to chunks, than the cache gains.
constexpr int64_t kMinWeightGradRows = 1024;

}  // namespace

// db_ih, db_hh of chain (l, d), and unless summed in the loop already, dW_ih and dW_hh from its dG
// over all steps, on the split_batch workers or on all of them.
void Recurrent::weight_grads(Backend& be, int64_t l, int64_t d, RecurrentSchedule schedule,
                             bool weights) {
  SF_PROFILE_SCOPE(scope_weight_grads_, static_cast<int>(l), static_cast<int>(d));
  const Weights& w = weights_[l * directions() + d];
  if (weights) {
    const int n = schedule == RecurrentSchedule::split_batch ? split_workers(be) : 1;
    Tensor copies = weight_grad_copies(be, l, l + 1, n, false);
    if (!copies.empty() && !k_major_pays(be, l, d, n, copies)) copies = Tensor();
    weight_grads_split(be, l, d, n, copies, params_.grad(w.w_hh), params_.grad(w.w_ih));
  }
  // d(b_ih), d(b_hh) and the cell's own parameters' gradients, summed by the backward cells.
  const Tensor dbias = chains_[l * directions() + d].dbias.tensor();
  const int64_t n = G_ * opt_.hidden_size;
  be.add(params_.grad(w.b_ih), dbias.slice(0, n));
  int64_t at_col = cell_.recurrent_grads ? 2 * n : n;
  be.add(params_.grad(w.b_hh), dbias.slice(at_col - n, at_col));
  for (size_t k = 0; k < w.own.size(); ++k) {
    const Tensor grad = params_.grad(w.own[k]);
    be.add(grad, dbias.slice(at_col, at_col + grad.numel()));
    at_col += grad.numel();
  }
  if (!projected()) return;
  // dW_hr(P, H) += dh^T(P, T*B) m(T*B, H)
  const Chain& ch = chains_[l * directions() + d];
  const int64_t P = opt_.proj_size, H = opt_.hidden_size;
  GemmShape hr{.trans_a = true, .m = P, .n = H, .k = T_ * B_, .lda = P, .ldb = H, .ldc = H};
  hr.beta = 1.0f;
  be.gemm(hr, gemm_dtype_, (low() ? ch.dh_all_low : ch.dh_all).tensor().data(),
          (low() ? ch.m_low : ch.m).tensor().data(), params_.grad(w.w_hr).data());
}

// dW_hh (G*H, P) and dW_ih (G*H, I) += chain (l, d)'s contributions over all steps. With n > 1
// (split_batch) each worker sums the steps of its share of the sequence (two small GEMMs on one
// thread each beat one split over both): the first into the gradients, the others into blocks of
// their own, added afterwards in worker order.
void Recurrent::weight_grads_split(Backend& be, int64_t l, int64_t d, int n, Tensor copies,
                                   Tensor dw_hh, Tensor dw_ih) {
  const int64_t GH = G_ * opt_.hidden_size, P = opt_.state_size(), I = layer_input_size(l);
  if (n == 1) return weight_grads_steps(be, l, d, 0, T_, dw_hh.data(), dw_ih.data(), true, copies);
  Tensor parts = dw_split_.get(be, params_.dtype(), {n, GH * (P + I)});
  be.run_concurrently(n, [&](int j) {
    Tensor part = parts.slice(j, j + 1), own = copies.empty() ? copies : copies.slice(j, j + 1);
    const int64_t t0 = T_ * j / n, t1 = T_ * (j + 1) / n;
    if (j == 0) return weight_grads_steps(be, l, d, t0, t1, dw_hh.data(), dw_ih.data(), true, own);
    if (t1 == t0) be.fill(part, 0.0);
    weight_grads_steps(be, l, d, t0, t1, part.data(), at(part, GH * P), false, own);
  });
  for (int j = 1; j < n; ++j) {
    Tensor part = parts.slice(j, j + 1).reshape({GH * (P + I)});
    be.add(dw_hh, part.slice(0, GH * P).reshape(dw_hh.shape()));
    be.add(dw_ih, part.slice(GH * P, GH * (P + I)).reshape(dw_ih.shape()));
  }
}

// Whether chain (l, d)'s weight gradients after the loop run faster on K-major copies than on
// the row-major originals: timed on first use of the problem (into scratch gradients), then
// kept in the autotune cache. With oneDNN on AVX512-BF16 alone the copies won (its A B^T ran
// 1.3-1.9x faster than A^T B); with AMX the originals did (W2 bf16: 250 against 266 ms a step).
bool Recurrent::k_major_pays(Backend& be, int64_t l, int64_t d, int n, Tensor copies) {
  if (weight_grad_chunk_ > 0 || !autotune::enabled()) return true;
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), GH = G_ * H;
  const int64_t I = layer_input_size(l);
  const std::string key = recurrent::tuning_prefix(be) + cell_.name + " weight gradients|h" +
                          std::to_string(H) + (projected() ? "_p" + std::to_string(P) : "") + "_i" +
                          std::to_string(I) + "_t" + std::to_string(T_) + "_b" +
                          std::to_string(B_) + "_workers" + std::to_string(n) + "_" +
                          std::string(dtype_name(gemm_dtype_));
  if (const auto cached = autotune::lookup(key)) return *cached == "k_major";
  autotune::announce_first_use("the " + upper(cell_.name) +
                               "'s schedules and weight-gradient layouts");
  Tensor scratch = dw_trial_.get(be, params_.dtype(), {GH * (P + I)});
  be.fill(scratch, 0.0);
  Tensor dw_hh = scratch.slice(0, GH * P).reshape({GH, P});
  Tensor dw_ih = scratch.slice(GH * P, GH * (P + I)).reshape({GH, I});
  const autotune::Timing timing;
  const std::vector<double> ms =
      recurrent::time_candidates(be, 2, [&](size_t k_major) {  // row-major, K-major
        weight_grads_split(be, l, d, n, k_major ? copies : Tensor(), dw_hh, dw_ih);
      });
  const bool k_major = ms[1] < ms[0];
  autotune::store(key, k_major ? "k_major" : "row_major", timing);
  if (autotune::verbose())
    std::fprintf(stderr,
                 "seqforge: autotune %s: weight gradients row_major %.2f ms, k_major %.2f ms -> "
                 "%s (%s)\n",
                 key.c_str(), ms[0], ms[1], k_major ? "k_major" : "row_major",
                 autotune::where_kept(key).c_str());
  return k_major;
}

// Room for n workers' K-major copies of the chunks of layers [l0, l1): with bf16 GEMMs, which may
// pay for the copying (after the loop, k_major_pays decides). f32 GEMMs gain about what the
// copies cost, and run on the row-major originals (no room); so do GEMMs with fewer than
// kMinWeightGradRows rows, W3's for one (0.58 against 0.54 ms a step), unless a test has set the
// chunks.
Tensor Recurrent::weight_grad_copies(Backend& be, int64_t l0, int64_t l1, int64_t n, bool in_loop) {
  const int64_t rows = in_loop ? T_ * B_ : T_ * B_ / n;  // of each worker's GEMMs
  if (gemm_dtype_ != DType::bf16 || (rows < kMinWeightGradRows && weight_grad_chunk_ == 0))
    return {};
  int64_t size = 0;
  for (int64_t l = l0; l < l1; ++l)
    size = std::max(size, (weight_grad_chunk(l, in_loop) * B_ + k_major_pad()) * k_major_rows(l));
  return k_major_.get(be, gemm_dtype_, {n, size});
}

// After chain (l, d)'s backward step `step`: its weight gradients over the chunk of steps that
// step completes, if it completes one.
void Recurrent::weight_grads_as_done(Backend& be, int64_t l, int64_t d, int64_t step,
                                     Tensor copies) {
  // The steps done are t >= step going forward in time (d = 0), t < T - step going backward.
  const int64_t chunk = weight_grad_chunk(l, true), done = T_ - step;
  if (done % chunk != 0 && done != T_) return;
  const int64_t m = done % chunk == 0 ? chunk : done % chunk;
  const int64_t t0 = d == 0 ? T_ - done : done - m;
  SF_PROFILE_SCOPE(scope_weight_grads_, static_cast<int>(l), static_cast<int>(d));
  const Weights& w = weights_[l * directions() + d];
  weight_grads_steps(be, l, d, t0, t0 + m, params_.grad(w.w_hh).data(), params_.grad(w.w_ih).data(),
                     true, copies);
}

int64_t Recurrent::k_major_pad() const {
  return 64 / static_cast<int64_t>(dtype_size(gemm_dtype_));
}

// Steps per chunk of layer l's weight gradients: K-major copies of about 8 MB after the backward
// loop, of about 1 MB inside it, where the chunk's dG is then still in the core's L2 (on W2 that
// halved the copying against 8 MB chunks); and at least 1024 rows (steps times B) per GEMM (W4 in
// f32, B = 64, with one step a chunk: 621 against 540 ms).
int64_t Recurrent::weight_grad_chunk(int64_t l, bool in_loop) const {
  if (weight_grad_chunk_ > 0) return std::min(weight_grad_chunk_, T_);
  const int64_t bytes = int64_t{in_loop ? 1 : 8} << 20;
  const int64_t column = k_major_rows(l) * static_cast<int64_t>(dtype_size(gemm_dtype_));
  return std::clamp<int64_t>(std::max(bytes / (B_ * column), (kMinWeightGradRows + B_ - 1) / B_), 1,
                             T_);
}

// dW_hh(G*H, H) += dG^T h_prev and dW_ih(G*H, I) += dG^T in over chain (l, d)'s steps [t0, t1)
// (= rather than += unless accumulating). With `copies`, a chunk of steps at a time, whose
// dG(steps*B, 4H), h_prev and in are first copied K-major into it (transposed: dG^T(4H, steps*B)
// and so on): oneDNN runs bf16 A^T B 1.6-1.9x faster with both operands K-major than on the
// row-major originals, and a chunk's copies stay in cache between the copying and the GEMMs.
void Recurrent::weight_grads_steps(Backend& be, int64_t l, int64_t d, int64_t t0, int64_t t1,
                                   void* dw_hh, void* dw_ih, bool accumulate, Tensor copies) {
  if (copies.empty()) return weight_grads_row_major(be, l, d, t0, t1, dw_hh, dw_ih, accumulate);
  const DType gt = gemm_dtype_;
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), D = directions();
  const int64_t I = layer_input_size(l), s = l * D + d;
  const Tensor dg_g = input_grads(s), dr_g = recurrent_grads(s);
  const Tensor out_g = low() ? out_low_[l].tensor() : out_[l].tensor();  // (T, B, D*P)
  const int64_t t_first = d == 0 ? 0 : T_ - 1, chunk = weight_grad_chunk(l, false);
  const int64_t GH = G_ * H, R = cell_.recurrent_grads ? GH : 0;  // dR's rows when apart
  for (int64_t c0 = t0; c0 < t1; c0 += chunk) {
    const int64_t c1 = std::min(t1, c0 + chunk), K = (c1 - c0) * B_;
    const int64_t ld = K + k_major_pad();      // rows a cache line off 4 KiB multiples
    void* dg_t = copies.data();                // (G*H, K)
    void* dr_t = at(copies, R ? GH * ld : 0);  // (G*H, K) dR when apart, else dG
    const int64_t h_row = GH + R;
    void* h_t = at(copies, h_row * ld);         // (P, K)
    void* in_t = at(copies, (h_row + P) * ld);  // (I, K)
    {
      SF_PROFILE_SCOPE(scope_copies_, static_cast<int>(l), static_cast<int>(d));
      be.copy_transposed(dg_t, ld, at(dg_g, c0 * B_ * GH), GH, K, GH, gt);
      if (R) be.copy_transposed(dr_t, ld, at(dr_g, c0 * B_ * GH), GH, K, GH, gt);
      be.copy_transposed(in_t, ld, at(in_gemm_[l], c0 * B_ * I), I, K, I, gt);
      // h_prev of steps [c0, c1): the outputs of the steps before (after, backward in time), and
      // h0 at the chain's first step; with variational dropout the masked states.
      int64_t a = c0, b = c1;  // the steps whose h_prev is an output
      if (locked_dropout()) {
        be.copy_transposed(h_t, ld, at(chains_[s].h_masked.tensor(), c0 * B_ * P), P, K, P, gt);
        a = b = c0;  // done
      } else if (t_first >= c0 && t_first < c1) {
        be.copy_transposed(at(copies, h_row * ld + (t_first - c0) * B_), ld, chain_h0(s).data(), P,
                           B_, P, gt);
        if (d == 0)
          a = c0 + 1;
        else
          b = c1 - 1;
      }
      if (b > a)
        be.copy_transposed(at(copies, h_row * ld + (a - c0) * B_), ld,
                           at(out_g, (d == 0 ? a - 1 : a + 1) * B_ * D * P + d * P), D * P,
                           (b - a) * B_, P, gt);
    }
    const float beta = accumulate || c0 > t0 ? 1.0f : 0.0f;
    GemmShape hh{.trans_b = true, .m = G_ * H, .n = P, .k = K, .lda = ld, .ldb = ld, .ldc = P};
    hh.beta = beta;
    be.gemm(hh, gt, dr_t, h_t, dw_hh);
    GemmShape ih{.trans_b = true, .m = G_ * H, .n = I, .k = K, .lda = ld, .ldb = ld, .ldc = I};
    ih.beta = beta;
    be.gemm(ih, gt, dg_t, in_t, dw_ih);
  }
}

// dW_hh(G*H, P) and dW_ih(G*H, I) += (or, not accumulating, =) the contributions of chain (l, d)'s
// steps [t0, t1), as A^T B GEMMs on the row-major dG, h_prev and in.
void Recurrent::weight_grads_row_major(Backend& be, int64_t l, int64_t d, int64_t t0, int64_t t1,
                                       void* dw_hh, void* dw_ih, bool accumulate) {
  if (t1 <= t0) return;
  const float beta = accumulate ? 1.0f : 0.0f;
  const DType gt = gemm_dtype_;
  const int64_t H = opt_.hidden_size, P = opt_.state_size(), D = directions();
  const int64_t I = layer_input_size(l), s = l * D + d;
  const Tensor dg_g = input_grads(s), dr_g = recurrent_grads(s);
  const Tensor out_g = low() ? out_low_[l].tensor() : out_[l].tensor();  // (T, B, D*P)

  // dW_hh += dR[first step]^T h_init + dR[other steps]^T out[their previous steps], or with
  // variational dropout dR^T h_masked over all the steps
  const int64_t t_first = d == 0 ? 0 : T_ - 1;
  int64_t a = t0, b = t1;  // the steps whose previous h is an output
  if (locked_dropout()) {
    GemmShape hh{.trans_a = true, .m = G_ * H, .n = P, .k = (t1 - t0) * B_, .lda = G_ * H};
    hh.ldb = hh.ldc = P;
    hh.beta = beta;
    be.gemm(hh, gt, at(dr_g, t0 * B_ * G_ * H), at(chains_[s].h_masked.tensor(), t0 * B_ * P),
            dw_hh);
    a = b = t0;  // done
  } else if (t_first >= t0 && t_first < t1) {
    GemmShape first{.trans_a = true, .m = G_ * H, .n = P, .k = B_, .lda = G_ * H, .ldb = P};
    first.ldc = P;
    first.beta = beta;
    be.gemm(first, gt, at(dr_g, t_first * B_ * G_ * H), chain_h0(s).data(), dw_hh);
    if (d == 0)
      a = t0 + 1;
    else
      b = t1 - 1;
  }
  if (b > a) {
    const int64_t h_start = d == 0 ? a - 1 : a + 1;
    GemmShape rest{.trans_a = true, .m = G_ * H, .n = P, .k = (b - a) * B_, .lda = G_ * H};
    rest.ldb = D * P;
    rest.ldc = P;
    rest.beta = a > t0 || b < t1 ? 1.0f : beta;  // after the first step's GEMM, accumulate
    be.gemm(rest, gt, at(dr_g, a * B_ * G_ * H), at(out_g, h_start * B_ * D * P + d * P), dw_hh);
  }
  // dW_ih += dG^T(G*H, steps*B) in(steps*B, I)
  GemmShape dwih{
      .trans_a = true, .m = G_ * H, .n = I, .k = (t1 - t0) * B_, .lda = G_ * H, .ldb = I};
  dwih.ldc = I;
  dwih.beta = beta;
  be.gemm(dwih, gt, at(dg_g, t0 * B_ * G_ * H), at(in_gemm_[l], t0 * B_ * I), dw_ih);
}

}  // namespace seqforge
