// train.device_check (src/train/device_check.hpp): the first step repeated on the CPU, with a
// "device" that is the CPU backend behind a wrapper, so that it runs on any machine. Unchanged, the
// two agree exactly (on the rows a micro-batch allows; not at all where the host could not hold the
// model's copy); an op made wrong on the device's side (GELU's backward, attention's output by 2%)
// is found, and the gradient or loss it spoils named.
#include "train/device_check.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench/recording_backend.hpp"
#include "io/file_util.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/data/loader.hpp"
#include "seqforge/train/config.hpp"
#include "test_util.hpp"
#include "train/run.hpp"

namespace seqforge {
namespace {

class WrongOp final : public RecordingBackend {
 public:
  enum class Op { none, gelu_backward, attention_forward };
  WrongOp(Backend& inner, Op op) : RecordingBackend(inner), op_(op) {}
  void gelu_backward(Tensor dx, Tensor dy, Tensor x, const ColumnMap& map) override {
    RecordingBackend::gelu_backward(dx, dy, x, map);
    if (op_ == Op::gelu_backward) RecordingBackend::scale(dx, 1.5);
  }
  void attention_forward(const AttentionForward& a, DType dt) override {
    RecordingBackend::attention_forward(a, dt);
    const AttentionShape& s = a.shape;
    if (op_ == Op::attention_forward)
      RecordingBackend::scale(Tensor(a.out, dt, {s.batch * s.seq * s.heads * s.head_dim}), 1.02);
  }

 private:
  Op op_;
};

TEST(DeviceCheck, FindsAWrongOpOnTheDevice) {
  const std::string text = (test::temp_dir("device_check") / "shakespeare.txt").string();
  std::ofstream(text)
      << io::read_file(SEQFORGE_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 6000);
  const Config c = Config::load(SEQFORGE_SOURCE_DIR "/examples/configs/shakespeare_gpt.yaml",
                                {"data.path=" + text, "model.embedding=32", "model.layers=2",
                                 "model.heads=2", "data.seq_len=32", "train.batch_size=4"});
  const Task task = load_task(c);
  auto cpu = make_cpu_backend();
  using Op = WrongOp::Op;
  for (const Op op : {Op::none, Op::gelu_backward, Op::attention_forward}) {
    WrongOp device(*cpu, op);
    std::unique_ptr<Model> model = make_model(task.model);
    model->initialize(device, 3);
    model->set_input_grad(false);
    Buffer seed_base;
    const Tensor base = seed_base.get(device, DType::i64, {1});
    device.set_seed_base(static_cast<const uint64_t*>(base.data()));
    Batch batch;
    Rng rng(1);
    assemble_batch(device, task, task.split().train, 0, 4, {}, rng, &batch);
    const DeviceCheck r =
        check_step_on_cpu(*model, device, task, {.max_rows = 4, .host_bytes = 1e9}, batch, base);
    ASSERT_TRUE(r.ran) << r.summary;
    std::printf("%s:%s\n",
                op == Op::none            ? "unchanged"
                : op == Op::gelu_backward ? "GELU's backward x1.5"
                                          : "attention's output x1.02",
                r.summary.c_str());
    EXPECT_EQ(r.bound, 1e-2);
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      if (model->parameters().fixed(i)) continue;
      for (double g : test::to_doubles(*cpu, model->parameters().grad(i)))
        ASSERT_EQ(g, 0.0) << "the device's gradients are zeroed again";
    }
    if (op == Op::none) {
      EXPECT_TRUE(r.agrees) << r.summary;
      EXPECT_EQ(r.worst, 0.0) << r.summary;
      EXPECT_NE(r.summary.find(" (4 of 4 rows; worst relative difference 0, in "),
                std::string::npos)
          << r.summary;
      // No more rows than the step's micro-batch; no copy the host's memory cannot hold.
      const DeviceCheck two =
          check_step_on_cpu(*model, device, task, {.max_rows = 2, .host_bytes = 1e9}, batch, base);
      EXPECT_NE(two.summary.find(" (2 of 4 rows; "), std::string::npos) << two.summary;
      EXPECT_TRUE(two.agrees) << two.summary;
      const DeviceCheck none =
          check_step_on_cpu(*model, device, task, {.max_rows = 4, .host_bytes = 1e5}, batch, base);
      EXPECT_FALSE(none.ran);
      EXPECT_EQ(none.summary, "the model is too large to copy into this machine's memory");
    } else {
      EXPECT_FALSE(r.agrees) << r.summary;
      EXPECT_GT(r.worst, 1e-2) << r.summary;
      // A wrong GELU gradient spoils the gradients of what comes before it (attention's, the
      // first block's MLP input); a wrong attention output the loss and every gradient.
      EXPECT_NE(
          r.summary.find(op == Op::gelu_backward ? "in the gradient of transformer.h." : "in the "),
          std::string::npos)
          << r.summary;
    }
  }
}

}  // namespace
}  // namespace seqforge
