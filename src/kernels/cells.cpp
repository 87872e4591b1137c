// The cells' registration: what the recurrence engine knows of each, and its kernels.
#include "kernels/cells.hpp"

#include <string>

#include "kernels/cells/gru.hpp"
#include "kernels/cells/lnlstm.hpp"
#include "kernels/cells/lstm.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

namespace {

struct Registration {
  CellType type;
  CellKernels kernels;
};

// LN-LSTM's own parameters: the gains of the normalised input and recurrent projections, and the
// gain and bias of the normalised cell state.
const CellParam kLayerNormParams[] = {{"ln_ih_weight", 4, 1.0},
                                      {"ln_hh_weight", 4, 1.0},
                                      {"ln_c_weight", 1, 1.0},
                                      {"ln_c_bias", 1, 0.0}};

const Registration kCells[] = {
    {{.kind = CellKind::lstm,
      .name = "lstm",
      .gates = 4,
      .min_hidden = 1,
      .cell_state = true,
      .folded_hh_bias_gates = 4,
      .recurrent_grads = false,
      .direct_state_grad = false,
      .bias_in_cell = false,
      .saved_per_hidden = 1,
      .saved_scalars = 0,
      .params = nullptr,
      .num_params = 0},
     {ref::lstm_cell_forward<float>, ref::lstm_cell_forward<double>, ref::lstm_cell_backward<float>,
      ref::lstm_cell_backward<double>, simd::lstm_cell_forward, simd::lstm_cell_backward}},
    {{.kind = CellKind::gru,
      .name = "gru",
      .gates = 3,
      .min_hidden = 1,
      .cell_state = false,
      .folded_hh_bias_gates = 2,
      .recurrent_grads = true,
      .direct_state_grad = true,
      .bias_in_cell = false,
      .saved_per_hidden = 1,
      .saved_scalars = 0,
      .params = nullptr,
      .num_params = 0},
     {ref::gru_cell_forward<float>, ref::gru_cell_forward<double>, ref::gru_cell_backward<float>,
      ref::gru_cell_backward<double>, simd::gru_cell_forward, simd::gru_cell_backward}},
    {{.kind = CellKind::lnlstm,
      .name = "lnlstm",
      .gates = 4,
      .min_hidden = 2,
      .cell_state = true,
      .folded_hh_bias_gates = 4,
      .recurrent_grads = true,
      .direct_state_grad = false,
      .bias_in_cell = true,
      .saved_per_hidden = 10,
      .saved_scalars = 3,
      .params = kLayerNormParams,
      .num_params = 4},
     {ref::lnlstm_cell_forward<float>, ref::lnlstm_cell_forward<double>,
      ref::lnlstm_cell_backward<float>, ref::lnlstm_cell_backward<double>,
      simd::lnlstm_cell_forward, simd::lnlstm_cell_backward}},
};

const Registration& registration(CellKind kind) {
  for (const Registration& r : kCells)
    if (r.type.kind == kind) return r;
  fail("unregistered cell kind ", static_cast<int>(kind));
}

}  // namespace

const CellType& cell_type(CellKind kind) { return registration(kind).type; }
const CellKernels& cell_kernels(CellKind kind) { return registration(kind).kernels; }

CellKind cell_kind(std::string_view name) {
  std::string known;
  for (const Registration& r : kCells) {
    if (name == r.type.name) return r.type.kind;
    known += (known.empty() ? "" : ", ") + std::string(r.type.name);
  }
  fail("unknown cell '", name, "' (expected one of: ", known, ")");
}

}  // namespace seqforge
