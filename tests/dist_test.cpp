// Gradient buckets and their all-reduces started from backward, with a communicator that
// records what it is asked to do; the single-process communicator.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/dist/communicator.hpp"
#include "seqforge/dist/gradient_sync.hpp"
#include "seqforge/nn/sequence_model.hpp"

namespace seqforge::dist_test {
namespace {

// Two ranks with identical gradients: a sum doubles every element, applied at wait().
class RecordingCommunicator final : public dist::Communicator {
 public:
  struct Call {
    float* data;
    size_t size;
    int phase;  // the hook call during which it started; -1 in finish()
  };
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_size() const override { return 2; }
  std::string name() const override { return "recording"; }
  void set_timeout(double, std::string) override {}
  Request all_reduce_start(std::span<float> data, dist::ReduceOp) override {
    calls.push_back({data.data(), data.size(), phase});
    return static_cast<Request>(calls.size() - 1);
  }
  bool test(Request) override { return false; }
  void wait(Request r) override {
    const Call& c = calls.at(static_cast<size_t>(r));
    for (size_t i = 0; i < c.size; ++i) c.data[i] *= 2;
    ++waited;
  }
  void all_reduce_sum(std::span<double>) override {}
  void broadcast(std::span<std::byte>) override {}
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message) override {
    throw std::runtime_error(message);
  }

  std::vector<Call> calls;
  int phase = -1, waited = 0;
};

ModelOptions char_model() {
  ModelOptions opt;
  opt.vocab_size = 11;
  opt.embedding_dim = 8;
  opt.rnn.hidden_size = 16;
  opt.rnn.num_layers = 2;
  opt.rnn.batch_first = true;
  opt.output_size = 11;
  opt.per_step = true;
  return opt;
}

TEST(GradientSync, BucketsStartDuringBackwardAndCoverTheArena) {
  auto be = make_cpu_backend();
  SequenceModel model(char_model());
  model.initialize(*be, 1);
  Parameters& p = model.parameters();
  RecordingCommunicator comm;
  dist::GradientSync sync(comm, *be, p, 800);  // the head alone (768 bytes), then one per weight
  int hook_calls = 0;
  model.set_grad_ready_hook([&](size_t first, size_t end) {
    comm.phase = hook_calls++;
    sync.ready(first, end);
    comm.phase = -1;
  });

  std::vector<int64_t> ids(3 * 5);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 11);
  Rng rng(2);
  Tensor y = model.forward(*be, Tensor(ids.data(), DType::i64, {3, 5}), {}, {}, true, rng);
  std::vector<float> dy(static_cast<size_t>(y.numel()), 0.01f);
  sync.begin_step();
  model.backward(*be, Tensor(dy.data(), DType::f32, y.shape()));
  EXPECT_EQ(hook_calls, 3);  // head, LSTM, embedding

  const auto* grads = static_cast<const float*>(p.grads().flat().data());
  std::vector<float> before(grads, grads + p.grads().elements());
  sync.finish();
  ASSERT_GE(sync.buckets(), 3u);
  ASSERT_EQ(comm.calls.size(), sync.buckets());
  EXPECT_EQ(comm.waited, static_cast<int>(sync.buckets()));
  // Every bucket started from a hook, the head's first, from the arena's end back to its start.
  size_t end = p.grads().elements();
  int phase = 0;
  for (const auto& c : comm.calls) {
    EXPECT_GE(c.phase, phase);
    phase = c.phase;
    EXPECT_EQ(c.data + c.size, grads + end);
    EXPECT_LE(c.size * sizeof(float), 64u * 16 * 4)  // the largest weight, alone
        << "a bucket of " << c.size << " floats";
    end -= c.size;
  }
  EXPECT_EQ(end, 0u);
  EXPECT_EQ(comm.calls.front().phase, 0);  // the head's bucket went out before the LSTM's backward
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(grads[i], 2 * before[i]) << i;

  // A rank without windows in a step starts every bucket itself, in the same order.
  RecordingCommunicator idle;
  dist::GradientSync idle_sync(idle, *be, p, 800);
  idle_sync.begin_step();
  idle_sync.finish();
  ASSERT_EQ(idle.calls.size(), comm.calls.size());
  for (size_t i = 0; i < idle.calls.size(); ++i) {
    EXPECT_EQ(idle.calls[i].data, comm.calls[i].data);
    EXPECT_EQ(idle.calls[i].size, comm.calls[i].size);
  }
}

TEST(Communicator, OneProcessNeedsNoMpi) {
  if (dist::launched_by_mpi()) GTEST_SKIP() << "running under mpirun";
  dist::Communicator& w = dist::world();
  EXPECT_EQ(w.size(), 1);
  EXPECT_EQ(w.rank(), 0);
  EXPECT_EQ(w.name(), "local");
  std::vector<float> x = {1, 2, 3};
  w.all_reduce(x, dist::ReduceOp::average);
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
}

}  // namespace
}  // namespace seqforge::dist_test
