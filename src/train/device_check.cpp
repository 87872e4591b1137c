// The first training step on a device repeated on the CPU (device_check.hpp).
#include "device_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <vector>

#include "seqforge/backend/buffer.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/rng.hpp"

namespace seqforge {

namespace {

// Floating-point operations the CPU's step may take: the rows of the batch are cut to this (about a
// second on two cores), one row at least, and the check skipped where one row would take more than
// the most.
constexpr double kWork = 3e10, kMostWork = 1e12;

std::vector<double> doubles_of(Backend& be, Tensor t) {
  std::vector<unsigned char> bytes(t.nbytes());
  be.download(bytes.data(), t);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  convert(bytes.data(), t.dtype(), out.data(), DType::f64, out.size());
  return out;
}

// A tensor of `device` copied into `held` on the CPU backend (empty stays empty).
Tensor on_cpu(Backend& cpu, Buffer& held, Backend& device, Tensor t) {
  if (t.empty()) return Tensor();
  Tensor c = held.get(cpu, t.dtype(), t.shape());
  device.download(c.data(), t);
  return c;
}

// Forward, the loss and backward of `rows` on `be`: the loss.
double step(Backend& be, Model& m, const Task& task, const Batch& rows, double loss_scale) {
  m.set_token_layout(rows.lengths, rows.segments);
  Rng salts(0x5eedba5e);  // the masks' seeds, as the first micro-batch of a training step
  const Tensor y = m.forward(be, rows.input, Tensor(), Tensor(), true, salts);
  Buffer dout_held, loss_held;
  const Tensor dout = dout_held.get(be, DType::f32, y.shape());
  const Tensor loss = loss_held.get(be, DType::f64, {1});
  loss_of(be, task, y, rows, dout, loss);
  if (loss_scale != 1.0) be.scale(dout, loss_scale);
  m.backward(be, dout);
  double l = 0;
  be.download(&l, loss);
  return l;
}

}  // namespace

DeviceCheck check_step_on_cpu(Model& model, Backend& device, const Task& task,
                              const DeviceCheckSettings& settings, const Batch& batch,
                              Tensor seed_base) {
  DeviceCheck r;
  const DType gemm = settings.gemm;
  const double loss_scale = settings.loss_scale;
  const int64_t T = batch.input.shape().rank() > 1 ? batch.input.dim(1) : 1;
  const double parameters = double(model.parameters().count());
  const double per_row = 6.0 * parameters * double(T);
  if (batch.size == 0 || per_row > kMostWork) {
    r.summary = "one row of the step is too large to repeat on the CPU";
    return r;
  }
  if (3 * 4 * parameters > settings.host_bytes / 4) {
    r.summary = "the model is too large to copy into this machine's memory";
    return r;
  }
  const int64_t rows =
      std::clamp<int64_t>(static_cast<int64_t>(kWork / per_row), 1,
                          std::min(batch.size, std::max<int64_t>(settings.max_rows, 1)));
  const Batch part = batch_rows(batch, 0, rows);

  // The model again on the CPU, with the device's parameters and the rows. Where the CPU cannot
  // run it (its memory, say), the check is left out rather than the run stopped.
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Model> mirror;
  Buffer held[6], cpu_base;
  Batch cpu_part;
  Parameters& dp = model.parameters();
  try {
    cpu = make_cpu_backend();
    std::string notice;
    const DType cpu_gemm =
        model_precision(gemm == DType::bf16 ? "bf16" : "fp32", *cpu, task.model, &notice);
    if (task.model.adapter.bf16_base && cpu_gemm != DType::bf16) {
      r.summary = "a bf16 base model needs bf16 GEMMs, which this CPU lacks";
      return r;
    }
    mirror = make_model(task.model);
    mirror->initialize(*cpu, 0);
    mirror->set_gemm_dtype(cpu_gemm);
    mirror->set_input_grad(false);
    Parameters& cp = mirror->parameters();
    bool same = dp.size() == cp.size();
    for (size_t i = 0; same && i < dp.size(); ++i) {
      const Tensor a = dp.value(i), b = cp.value(i);
      same = dp.values().entries()[i].name == cp.values().entries()[i].name &&
             a.shape() == b.shape() && a.dtype() == b.dtype() && dp.fixed(i) == cp.fixed(i);
    }
    if (!same) {
      r.summary = "the model's copy on the CPU has other parameters";
      return r;
    }
    for (size_t i = 0; i < dp.size(); ++i) device.download(cp.value(i).data(), dp.value(i));
    cpu_part.size = part.size;
    cpu_part.input = on_cpu(*cpu, held[0], device, part.input);
    cpu_part.target = on_cpu(*cpu, held[1], device, part.target);
    cpu_part.labels = on_cpu(*cpu, held[2], device, part.labels);
    cpu_part.mask = on_cpu(*cpu, held[3], device, part.mask);
    cpu_part.lengths = on_cpu(*cpu, held[4], device, part.lengths);
    cpu_part.segments = on_cpu(*cpu, held[5], device, part.segments);
  } catch (const std::exception& e) {
    r.summary = std::string("the CPU could not hold the model's copy: ") + e.what();
    return r;
  }

  // The same dropout masks: both backends' seed base set to one value.
  const uint64_t base = 0x0dec0de5eedull;
  device.upload(seed_base, &base);
  const Tensor cpu_seed = cpu_base.get(*cpu, DType::i64, {1});
  cpu->upload(cpu_seed, &base);
  cpu->set_seed_base(static_cast<const uint64_t*>(cpu_seed.data()));

  const double device_loss = step(device, model, task, part, loss_scale);
  double cpu_loss = 0;
  try {
    cpu_loss = step(*cpu, *mirror, task, cpu_part, loss_scale);
  } catch (const std::exception& e) {
    dp.zero_grad(device);
    r.summary = std::string("the CPU could not repeat the step: ") + e.what();
    return r;
  }
  Parameters& cp = mirror->parameters();
  r.ran = true;
  r.bound = gemm == DType::f32 && !settings.reduced ? 1e-2 : 1e-1;
  auto record = [&](double difference, const std::string& where) {
    if (difference > r.worst || std::isnan(difference) || r.summary.empty()) {
      r.worst = std::isnan(difference) ? std::numeric_limits<double>::infinity()
                                       : std::max(r.worst, difference);
      r.summary = where;
    }
  };
  record(std::fabs(device_loss - cpu_loss) / std::max(std::fabs(cpu_loss), 1e-12), "the loss");
  // Each gradient against its norm, or a thousandth of the whole gradient's where that is more
  // (a gradient near 0 is rounding).
  std::vector<std::vector<double>> want(dp.size()), got(dp.size());
  double whole = 0;
  for (size_t i = 0; i < dp.size(); ++i) {
    if (dp.fixed(i)) continue;
    want[i] = doubles_of(*cpu, cp.grad(i));
    got[i] = doubles_of(device, dp.grad(i));
    for (double w : want[i]) whole += w * w;
  }
  for (size_t i = 0; i < dp.size(); ++i) {
    if (dp.fixed(i)) continue;
    double norm = 0, diff = 0;
    for (size_t e = 0; e < want[i].size(); ++e) {
      norm += want[i][e] * want[i][e];
      diff += (got[i][e] - want[i][e]) * (got[i][e] - want[i][e]);
    }
    const double scale = std::max(std::sqrt(norm), 1e-3 * std::sqrt(whole));
    record(scale > 0 ? std::sqrt(diff) / scale : (diff > 0 ? INFINITY : 0.0),
           "the gradient of " + dp.values().entries()[i].name);
  }
  dp.zero_grad(device);
  r.agrees = r.worst <= r.bound;
  char figures[160];
  std::snprintf(figures, sizeof figures, " (%lld of %lld rows; worst relative difference %.2g, in ",
                static_cast<long long>(rows), static_cast<long long>(batch.size), r.worst);
  char bound[64];
  std::snprintf(bound, sizeof bound, "; at most %.2g)", r.bound);
  r.summary = std::string(figures) + r.summary + bound;
  return r;
}

}  // namespace seqforge
