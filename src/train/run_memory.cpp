#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "run.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "task_type.hpp"

namespace seqforge {

int64_t forward_rows(const Config& c) {
  const int64_t batch = c.integer("train.batch_size");
  if (c.str("train.micro_batch_size") == "auto") return batch;  // until auto_micro_batch
  const int64_t micro = c.integer("train.micro_batch_size");
  return micro > 0 ? std::min(micro, batch) : batch;
}

int64_t batch_bytes(const Task& t, int64_t batch_size) {
  return batch_size * t.steps() * task_type(t.kind).bytes_per_step(t);
}

// Floats a training step keeps per batch: per layer and direction the gates (T, B, G*H), the
// cell's saved state (T, B, H; the LSTM's c and tanh(c), the GRU's R_n and its dR (T, B, G*H)),
// the layer output (T, B, D*H), its input gradient (T, B, I_l), dropout masks and masked copies;
// half-precision GEMMs add half-size copies of gates and outputs.
double activation_bytes(const ModelOptions& m, int64_t T, int64_t B, bool half) {
  if (m.family == ModelFamily::decoder) {
    // Per layer and token what backward keeps: both norms' outputs, q, k and v (and their
    // per-head copies under GQA), the attention output, the stream after attention and after
    // the layer, the MLP's gate, up and product (3F); Gemma adds q and k before their norms and
    // both branches before theirs. Then the head: logits and their gradient (2V), or a
    // classifier's rows.
    const DecoderOptions& o = m.decoder;
    const double N = double(T) * double(B), C = double(o.hidden_size),
                 F = double(o.intermediate_size), HD = double(o.num_heads * o.head_dim),
                 W = double((o.num_heads + 2 * o.num_kv_heads) * o.head_dim);
    double layer = 4 * C + W + HD + 3 * F + (o.num_kv_heads < o.num_heads ? 3 * HD : 0);
    if (o.gemma) layer += 2 * C + HD + double(o.num_kv_heads * o.head_dim);
    const double head = o.num_labels > 0 ? 0 : 2.0 * double(o.vocab_size);
    return 4 * N * (double(o.num_layers) * layer + head + 2 * C);
  }
  if (m.family == ModelFamily::transformer) {
    // Per block and token: the LayerNorm outputs, qkv, attention output, both branch outputs,
    // the residual sums, the MLP's 4C pre- and post-GELU (18C), and in backward the MLP's 4C and
    // qkv's 3C gradients and four C-wide ones (11C); the logits and their gradient (2V).
    const double N = double(T) * double(B), C = double(m.transformer.n_embd);
    return 4 * N * (double(m.transformer.n_layer) * 29 * C + 2.0 * double(m.vocab_size));
  }
  const RecurrentOptions& o = m.rnn;
  const double D = o.bidirectional ? 2 : 1, H = static_cast<double>(o.hidden_size);
  double floats = 0;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const double I = l == 0 ? static_cast<double>(o.input_size) : D * H;
    const CellType& cell = cell_type(o.cell);
    const double GH = cell.gates * H;
    // What each chain keeps for backward: c, the cell's saved values, dR apart from dG.
    const double saved = (cell.cell_state ? H : 0) +
                         static_cast<double>(saved_columns(cell, o.hidden_size)) +
                         (cell.recurrent_grads ? GH : 0);
    double layer = D * (GH + saved) + D * H + I;
    if (o.dropout > 0 && l + 1 < o.num_layers) layer += 2 * D * H;
    if (half) layer += 0.5 * (D * GH + D * H);
    floats += layer * T * B;
  }
  const double head_rows = m.per_step ? static_cast<double>(T * B) : static_cast<double>(B);
  floats += 2 * head_rows * (D * H + static_cast<double>(m.output_size));
  if (m.vocab_size > 0) floats += 2.0 * T * B * m.embedding_dim;
  return floats * 4;
}

namespace {
// Bytes of a model's parameters in f32, with their gradients and AdamW's two moments (the ones
// that train) when `training`.
double parameter_bytes(const Parameters& p, bool training) {
  double values = 0, trained = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double n = double(p.values().entries()[i].shape.numel());
    values += n;
    if (!p.fixed(i)) trained += n;
  }
  return sizeof(float) * (values + (training ? 3 * trained : 0));
}

// The most examples at once, at most `batch`, as train.micro_batch_size auto counts them: on a
// device, 90% of its free memory holds the parameters, gradients and AdamW's moments (`fixed`)
// and the activations (the allocator, workspaces and the loader's buffers take the rest); on the
// CPU, the activations take at most half the available memory, as diagnose checks.
int64_t examples_that_fit(double free_bytes, bool device, double fixed, double per_example,
                          int64_t batch) {
  const double budget = device ? 0.9 * free_bytes - fixed : 0.5 * free_bytes;
  return static_cast<int64_t>(std::clamp(std::floor(budget / per_example), 0.0, double(batch)));
}
}  // namespace

std::string step_fit_problem(double free_bytes, const std::string& device, Model& model,
                             const ModelOptions& m, int64_t T, int64_t batch, bool half,
                             double* need_bytes, bool own_memory) {
  const double mb = 1 << 20;
  const double fixed = parameter_bytes(model.parameters(), true);
  const double per_example = std::max(1.0, activation_bytes(m, T, 1, half));
  const double need = fixed + per_example * double(batch);
  if (need_bytes) *need_bytes = need;
  if (need <= free_bytes) return "";
  // What auto would take; where even that is none, what fits at all.
  int64_t fits = examples_that_fit(free_bytes, own_memory, fixed, per_example, batch);
  if (fits == 0)
    fits = static_cast<int64_t>(std::max(0.0, std::floor((free_bytes - fixed) / per_example)));
  char head[256];
  std::snprintf(head, sizeof head,
                "a training step needs about %.0f MiB on %s (parameters, gradients and AdamW's "
                "moments %.0f MiB, activations %.0f MiB for %lld examples at once), more than the "
                "%.0f MiB free",
                need / mb, device.c_str(), fixed / mb, per_example * double(batch) / mb,
                static_cast<long long>(batch), free_bytes / mb);
  if (fits >= 1)
    return std::string(head) + ": train.micro_batch_size " + std::to_string(fits) +
           " fits (the same steps, run in micro-batches; `auto` chooses it)";
  return std::string(head) +
         ": even a batch of 1 does not fit; make the model (model.hidden, model.layers) or the "
         "windows (data.lookback, data.seq_len) smaller";
}

int64_t auto_micro_batch(Model& model, const ModelOptions& m, int64_t T, int64_t batch, bool half,
                         double free_bytes, bool device, std::string* why) {
  const double mb = 1 << 20;
  const double fixed = parameter_bytes(model.parameters(), true);
  const double per_example = std::max(1.0, activation_bytes(m, T, 1, half));
  const int64_t fits = examples_that_fit(free_bytes, device, fixed, per_example, batch);
  const int64_t chosen = device ? fits : std::max<int64_t>(fits, 1);
  char detail[256];
  std::snprintf(detail, sizeof detail, "about %.1f MiB of activations an example; %s",
                per_example / mb,
                device ? "90% of the device's free memory for them, the parameters, gradients "
                         "and AdamW's moments"
                       : "half the available memory for them");
  *why = "train.micro_batch_size auto: " +
         (chosen >= batch ? "the whole batch of " + std::to_string(batch) + " at once"
          : chosen == 0   ? std::string("not even one example fits")
                          : std::to_string(chosen) + " of each batch of " + std::to_string(batch) +
                              " at once") +
         " (" + detail + ", " + std::to_string(int64_t(free_bytes / mb)) + " MiB " +
         (device ? "free" : "available") + ")";
  return chosen;
}

void check_model_fits(Model& model, const Config& c, bool training) {
  const double mb = 1 << 20;
  const Parameters& p = model.parameters();
  const double need = parameter_bytes(p, training);
  const double available = double(available_memory_bytes());
  if (need <= available) return;
  const std::string family = c.str("model.family");
  const std::string what =
      family == "decoder"
          ? "use a smaller model than " + c.str("model.init_from") + "/config.json's" +
                (training && c.str("adapter.kind") == "none" ? ", or adapters (adapter.kind: dora)"
                                                             : "")
          : "make " + std::string(family == "transformer" ? "model.embedding" : "model.hidden") +
                " or model.layers smaller (now " +
                std::to_string(
                    c.integer(family == "transformer" ? "model.embedding" : "model.hidden")) +
                " and " + std::to_string(c.integer("model.layers")) + ")";
  fail(c.source(), ": the model's ", p.count(), " parameters need ",
       static_cast<int64_t>(need / mb), " MB",
       training ? " (values, gradients and AdamW's two moments)" : "", ", more than the ",
       static_cast<int64_t>(available / mb), " MB available: ", what);
}

}  // namespace seqforge
