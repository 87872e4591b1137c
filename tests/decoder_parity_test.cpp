// Llama-family decoder parity with PyTorch: every fixture of tests/python/make_decoder_fixtures.py
// (a reference written after Hugging Face's Llama and Qwen2 code, in float64 on the stored
// weights) is a Hugging Face folder that seqforge reads as a user's model (config.json, the
// weights in one file or shards, f32 or bf16): the logits, the mean cross-entropy and every
// parameter gradient. The CPU backend runs in f32 (max relative error <= 1e-5), the reference
// backend in f64 (<= 1e-10). Finite differences check the f64 gradients on their own, and the
// folder reader refuses bad folders with one line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/decoder.hpp"
#include "test_util.hpp"

namespace seqforge::decoder_parity_test {
namespace {

namespace fs = std::filesystem;
using test::HostTensor;
using test::max_rel_error;
using test::relative_l2;
using test::to_doubles;

std::string fixture_dir() {
  const char* env = std::getenv("SEQFORGE_FIXTURE_DIR");
  return env ? env : SEQFORGE_FIXTURE_DIR;
}

std::vector<std::string> fixture_names() {
  std::ifstream index(fixture_dir() + "/decoder_index.txt");
  std::vector<std::string> names;
  for (std::string line; std::getline(index, line);)
    if (!line.empty()) names.push_back(line);
  return names;
}

std::vector<double> values(const io::SafetensorsFile& f, const std::string& name) {
  const io::SafetensorsEntry* e = f.find(name);
  SF_CHECK(e, f.source(), ": no tensor ", name);
  std::vector<double> out(static_cast<size_t>(Shape(e->shape).numel()));
  convert(f.bytes(*e).data(), e->dtype, out.data(), DType::f64, out.size());
  return out;
}

struct Errors {
  double logits = 0, loss = 0, grads = 0, torch_f32 = 0;
  bool left_padded = false;        // the logits also measured against HF's left-padded batch
  bool padded_classifier = false;  // a classifier over padded rows, no dropout: has them
  std::string worst;
};

// Loads the fixture's folder as a user's model on `be`, runs forward, the loss and backward, and
// measures each against the reference.
Errors replay(const std::string& name, Backend& be, DType dt) {
  const std::string folder = fixture_dir() + "/" + name;
  const io::SafetensorsFile expected = io::SafetensorsFile::read(folder + "/expected.safetensors");
  DecoderOptions o = read_decoder_config(folder + "/config.json");
  const nlohmann::json fixture = nlohmann::json::parse(expected.metadata().at("fixture"));
  if (fixture.contains("adapter")) {
    o.adapter.kind = fixture["adapter"] == "dora" ? AdapterKind::dora : AdapterKind::lora;
    o.adapter.rank = fixture["r"];
    o.adapter.alpha = fixture["a"];
    o.adapter.targets = fixture["targets"].get<std::vector<std::string>>();
    o.adapter.dropout = fixture.value("drop", 0.0);
  }
  o.num_labels = fixture.value("k", 0);
  Decoder model(o, dt);
  model.initialize(be, 0);
  load_hf_weights(folder, model, be);
  Parameters& p = model.parameters();
  if (fs::exists(folder + "/adapter.safetensors")) {  // the adapters' and the head's values
    const io::SafetensorsFile adapters = io::SafetensorsFile::read(folder + "/adapter.safetensors");
    std::vector<std::string> loaded;
    for (size_t i = 0; i < p.size(); ++i) {
      const std::string& pname = p.values().entries()[i].name;
      if (!adapters.find(pname)) continue;
      upload_doubles(be, p.value(i), values(adapters, pname));
      loaded.push_back(pname);
    }
    EXPECT_EQ(loaded.size(), adapters.entries().size()) << name;
    model.init_adapters(be, loaded);
  }
  const HostTensor lengths(be, DType::i64, Shape(expected.find("lengths")->shape),
                           values(expected, "lengths"));
  if (o.num_labels > 0) model.set_token_layout(lengths.t, {});
  const HostTensor ids(be, DType::i64, Shape(expected.find("ids")->shape), values(expected, "ids"));
  const HostTensor targets(be, DType::i64, Shape(expected.find("targets")->shape),
                           values(expected, "targets"));
  Rng rng(1);  // adapter dropout draws its masks as the fixture did, in a training pass
  const Tensor logits = model.forward(be, ids.t, o.adapter.dropout > 0, rng);
  Errors e;
  e.torch_f32 = std::stod(expected.metadata().at("torch_f32"));
  e.logits = max_rel_error(to_doubles(be, logits), values(expected, "logits"));
  // A classifier's rows padded on the right score as HF's padded on the left
  // (tokenizer_config.json's padding_side), where a row's tokens sit at later positions: rotary
  // attention sees only their differences.
  const std::vector<double> lens = values(expected, "lengths");
  e.padded_classifier = o.num_labels > 0 && o.adapter.dropout == 0 &&
                        *std::min_element(lens.begin(), lens.end()) < double(ids.t.shape()[1]);
  if (expected.find("logits_left")) {
    e.left_padded = true;
    e.logits =
        std::max(e.logits, max_rel_error(to_doubles(be, logits), values(expected, "logits_left")));
  }
  HostTensor dlogits(be, dt, logits.shape(), std::vector<double>(size_t(logits.numel())));
  p.zero_grad(be);
  const double loss = be.cross_entropy_loss(logits, targets.t, {}, -1, dlogits.t);
  const double want = values(expected, "loss")[0];
  e.loss = std::abs(loss - want) / std::abs(want);
  model.backward_logits(be, dlogits.t);
  // The parameters that train are those the reference has gradients of, and no others.
  std::vector<size_t> trained;
  for (size_t i = 0; i < p.size(); ++i) {
    const bool has = expected.find("grad." + p.values().entries()[i].name) != nullptr;
    EXPECT_EQ(p.grad(i).numel() > 0, has) << name << ": " << p.values().entries()[i].name;
    if (has) trained.push_back(i);
  }
  // A gradient that is zero in exact arithmetic comes out as rounding noise, measured against
  // the largest gradient: exactly 0 in the reference (q and k of one-token rows: the softmax over
  // one key is constant), or noise 12 orders below the largest (q and k where every key a query
  // sees has the same value, a row of one repeated token: the probabilities' sum is 1 only
  // within rounding).
  double scale = 0;
  for (size_t i : trained)
    for (double v : values(expected, "grad." + p.values().entries()[i].name))
      scale = std::max(scale, std::abs(v));
  for (size_t i : trained) {
    const std::string& pname = p.values().entries()[i].name;
    const std::vector<double> got = to_doubles(be, p.grad(i)),
                              want_grad = values(expected, "grad." + pname);
    double err = 0;
    if (std::all_of(want_grad.begin(), want_grad.end(),
                    [&](double v) { return std::abs(v) <= 1e-12 * scale; })) {
      for (double v : got) err = std::max(err, std::abs(v) / scale);
    } else {
      err = max_rel_error(got, want_grad);
    }
    if (err > e.grads) e.grads = err, e.worst = pname;
  }
  return e;
}

void run_all(const char* backend_name, DType dt, double tolerance) {
  const auto names = fixture_names();
  ASSERT_GE(names.size(), 13u) << "no decoder fixtures in " << fixture_dir()
                               << " (run tests/python/make_decoder_fixtures.py)";
  auto be = make_backend(backend_name);
  std::printf("PyTorch parity of the Llama-family decoder, %s backend, %s: max relative error\n",
              backend_name, std::string(dtype_name(dt)).c_str());
  std::printf("  %-56s %-9s %-9s %-9s %-10s %s\n", "configuration", "logits", "loss", "grads",
              "torch-f32", "worst gradient");
  int left_padded = 0, padded_classifiers = 0;
  for (const auto& name : names) {
    const Errors e = replay(name, *be, dt);
    left_padded += e.left_padded;
    padded_classifiers += e.padded_classifier;
    std::printf("  %-56s %-9.2e %-9.2e %-9.2e %-10.2e %s\n", name.c_str(), e.logits, e.loss,
                e.grads, e.torch_f32, e.worst.c_str());
    // In f32, within the tolerance or within 4x PyTorch's own float32 error, whichever is
    // larger: tiny random models with wide weights are ill-conditioned (a bias gradient summed
    // over two rows that nearly cancel, a q/k norm over a projection whose terms cancel), and
    // float32 itself is off by that much there; one summation order of PyTorch's can land 6x
    // luckier than another, so the fixture keeps the worst of five, and of two more whose
    // attention is differentiated as flash attention (and seqforge's kernels) do, from the
    // output rather than the probabilities, which rounds a nearly one-hot row's gradient
    // otherwise. The f64 run checks every fixture at the full tolerance.
    const double bound = dt == DType::f32 ? std::max(tolerance, 4 * e.torch_f32) : tolerance;
    EXPECT_LE(e.logits, bound) << name;
    EXPECT_LE(e.loss, bound) << name;
    EXPECT_LE(e.grads, bound) << name << ": worst " << e.worst;
  }
  EXPECT_EQ(left_padded, padded_classifiers)
      << "classifier fixtures over padded rows with HF's left-padded logits";
  std::printf(
      "  error: max |got - want| / max(|want|, 0.1 max|want|) against PyTorch float64;\n"
      "  torch-f32: PyTorch's own float32 logits and gradients under the same metric, the worst "
      "of\n"
      "  five summation orders of its Linears and two runs with flash attention's backward\n");
}

// In the PyTorchParity suite, which the test script runs after the fixtures are written.
TEST(PyTorchParity, DecoderCpuF32) { run_all("cpu", DType::f32, 1e-5); }
TEST(PyTorchParity, DecoderSealedF32) { run_all("sealed", DType::f32, 1e-5); }
TEST(PyTorchParity, DecoderReferenceF64) { run_all("reference", DType::f64, 1e-10); }
TEST(PyTorchParity, CudaDecoderF32) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  run_all("cuda", DType::f32, 1e-5);
}
TEST(PyTorchParity, CudaDecoderF64) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  run_all("cuda", DType::f64, 1e-10);
}

// Central differences of the loss in f64 against backward, for entries of every kind of
// parameter of a model with grouped-query attention, biases, Llama 3's rope scaling and a
// sliding window of 2 on its first layer.
TEST(Decoder, GradientsMatchFiniteDifferences) {
  DecoderOptions o;
  o.vocab_size = 7, o.hidden_size = 8, o.intermediate_size = 6, o.num_layers = 2;
  o.num_heads = 4, o.num_kv_heads = 2, o.head_dim = 4, o.qkv_bias = true, o.o_bias = true;
  o.rope_theta = 500000,
  o.rope_scaling = {.llama3 = true, .factor = 4, .original_max_position_embeddings = 8};
  o.sliding = {true, false}, o.sliding_window = 2;
  o.initializer_range = 0.5;
  auto be = make_reference_backend();
  Decoder model(o, DType::f64);
  model.initialize(*be, 3);
  const HostTensor ids(*be, DType::i64, {2, 5}, {1, 3, 0, 6, 2, 5, 5, 4, 1, 0});
  const HostTensor targets(*be, DType::i64, {10}, {3, 0, 6, 2, 1, 5, 4, 1, 0, 2});
  HostTensor dlogits(*be, DType::f64, {10, 7}, std::vector<double>(70));
  Rng rng(0);
  const auto loss = [&] {
    return be->cross_entropy_loss(model.forward(*be, ids.t, false, rng), targets.t, {}, -1,
                                  dlogits.t);
  };
  Parameters& p = model.parameters();
  p.zero_grad(*be);
  loss();
  model.backward_logits(*be, dlogits.t);
  double worst = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const Tensor value = p.value(i);
    std::vector<double> v = to_doubles(*be, value), grad = to_doubles(*be, p.grad(i));
    for (size_t k = 0; k < v.size(); k += std::max<size_t>(1, v.size() / 5)) {
      const double h = 1e-6, keep = v[k];
      v[k] = keep + h;
      be->upload(value, v.data());
      const double up = loss();
      v[k] = keep - h;
      be->upload(value, v.data());
      const double down = loss();
      v[k] = keep;
      be->upload(value, v.data());
      const double numeric = (up - down) / (2 * h);
      worst = std::max(worst, std::abs(numeric - grad[k]) / std::max(1e-3, std::abs(numeric)));
      EXPECT_NEAR(grad[k], numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << p.values().entries()[i].name << "[" << k << "]";
    }
  }
  std::printf("decoder finite differences: worst relative gap %.1e\n", worst);
}

// A small Llama (grouped-query attention, biases, Llama 3's rope scaling) or Gemma 3 decoder with
// `kind` adapters on every Linear, their B away from zero so that they count.
DecoderOptions small_decoder(bool gemma, AdapterKind kind) {
  DecoderOptions o;
  o.vocab_size = 11, o.hidden_size = 12, o.intermediate_size = 10, o.num_layers = 2;
  o.num_heads = 6, o.num_kv_heads = gemma ? 6 : 2, o.head_dim = 4;
  o.initializer_range = 0.3;
  if (gemma) {
    o.model_type = "gemma3_text", o.gemma = true, o.activation = GluKind::gelu_tanh;
    o.num_kv_heads = 3;
    o.query_pre_attn_scalar = 8, o.rope_local_theta = 100, o.sliding_window = 37;
    o.sliding = {true, false};
  } else {
    o.qkv_bias = o.o_bias = true;
    o.rope_theta = 500000;
    o.rope_scaling = {.llama3 = true, .factor = 4, .original_max_position_embeddings = 8};
  }
  o.adapter.kind = kind;
  o.adapter.rank = 2;
  o.adapter.alpha = 3;
  o.adapter.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return o;
}

std::unique_ptr<Decoder> make_small_decoder(Backend& be, const DecoderOptions& o) {
  auto model = std::make_unique<Decoder>(o);
  model->initialize(be, 5);
  Parameters& p = model->parameters();
  Rng values(9);
  for (size_t i = 0; i < p.size(); ++i) {
    const auto& e = p.values().entries()[i];
    if (e.name.find("lora_B") == std::string::npos) continue;
    std::vector<double> b(static_cast<size_t>(Shape(e.shape).numel()));
    for (double& v : b) v = 0.4 * (values.uniform() - 0.5);
    be.copy(p.value(i), HostTensor(be, DType::f32, e.shape, b).t);
  }
  return model;
}

// Decoding with the key/value cache (a prompt, then one token at a time) gives the logits a full
// forward pass gives the same tokens: Llama with grouped-query attention, biases and Llama 3's
// rope scaling, and Gemma 3 (q/k norms, local layers with their own base and a sliding window
// of 37 of the 150 tokens, a scaled embedding),
// each without adapters and with LoRA or DoRA on every Linear (B away from zero).
TEST(DecoderDecode, CachedKeysAndValuesGiveTheFullPassLogits) {
  const int64_t kTokens = 150;
  for (const bool gemma : {false, true})
    for (const AdapterKind kind : {AdapterKind::none, AdapterKind::lora, AdapterKind::dora}) {
      auto be = make_cpu_backend();
      // Two equal models: decoding must not lean on state a forward pass left behind.
      const DecoderOptions o = small_decoder(gemma, kind);
      auto full = make_small_decoder(*be, o), cached = make_small_decoder(*be, o);
      Decoder& model = *cached;
      std::vector<double> ids(kTokens);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = double((i * 5 + 2) % 11);
      const HostTensor all(*be, DType::i64, {1, kTokens}, ids);
      Rng rng(1);
      const std::vector<double> want = to_doubles(*be, full->forward(*be, all.t, false, rng));
      model.decode_start(*be, kTokens);
      std::vector<double> got;
      const HostTensor prompt(*be, DType::i64, {1, 6},
                              std::vector<double>(ids.begin(), ids.begin() + 6));
      for (double v : to_doubles(*be, model.decode(*be, prompt.t))) got.push_back(v);
      for (size_t i = 6; i < ids.size(); ++i) {
        const HostTensor one(*be, DType::i64, {1, 1}, {ids[i]});
        for (double v : to_doubles(*be, model.decode(*be, one.t))) got.push_back(v);
      }
      const std::string what =
          std::string(gemma ? "gemma3" : "llama") + ", adapter " + std::to_string(int(kind));
      EXPECT_EQ(model.decoded(), kTokens) << what;
      // One row's GEMMs and 150 rows' sum in different orders wherever a provider's kernel
      // depends on the row count (oneDNN's: 3.8e-6 to 8.7e-6 here, and to 1.03e-5 where the
      // race gives some shapes to another provider); a wrong cache is off by far more.
      EXPECT_LE(max_rel_error(got, want), 3e-5) << what;
      const HostTensor more(*be, DType::i64, {1, 1}, {1});
      EXPECT_THROW(model.decode(*be, more.t), Error) << what;  // past the room made
    }
}

// A cache larger than memory is one error naming the count that fits, before any allocation.
TEST(DecoderDecode, ACacheLargerThanMemoryIsRefusedByName) {
  auto be = make_cpu_backend();
  DecoderOptions o = small_decoder(false, AdapterKind::none);
  o.max_positions = int64_t{1} << 50;
  auto model = make_small_decoder(*be, o);
  const std::string error = test::error_of([&] { model->decode_start(*be, int64_t{1} << 49); });
  EXPECT_NE(error.find("generating 562949953421312 tokens in all keeps"), std::string::npos)
      << error;
  EXPECT_NE(error.find("generate at most"), std::string::npos) << error;
  model->decode_start(*be, 8);  // a cache that fits still starts
}

// Logits and every parameter's gradient of one step (a cross-entropy loss) of `m` on 2 x 9 ids.
// A training pass draws adapter dropout's masks from Rng(1).
std::pair<std::vector<double>, std::vector<double>> decoder_step(Backend& be, Decoder& m,
                                                                 bool training = false) {
  std::vector<double> ids(18), targets(18);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = double((i * 5 + 2) % 11);
    targets[i] = double((i * 3 + 1) % 11);
  }
  const HostTensor in(be, DType::i64, {2, 9}, ids), y(be, DType::i64, {18}, targets);
  Rng rng(1);
  const Tensor out = m.forward(be, in.t, training, rng);
  const std::vector<double> logits = to_doubles(be, out);
  HostTensor dlogits(be, DType::f32, {18, 11}, std::vector<double>(18 * 11));
  be.cross_entropy_loss(out, y.t, {}, -1, dlogits.t);
  m.parameters().zero_grad(be);
  m.backward_logits(be, dlogits.t);
  std::vector<double> grads;
  for (size_t i = 0; i < m.parameters().size(); ++i)
    for (double g : to_doubles(be, m.parameters().grad(i))) grads.push_back(g);
  return {logits, grads};
}

// Activation checkpointing: backward recomputes each layer's activations from its input in one
// set all layers share, and the logits and every gradient are the bits of the run that keeps
// them all; f32 and bf16 GEMMs, with and without adapters (with adapter dropout, whose masks the
// recomputation draws again), Llama and Gemma 3, and decoding afterwards still equals the full
// pass.
TEST(Decoder, CheckpointedActivationsGiveTheSameBits) {
  for (const bool gemma : {false, true})
    for (const AdapterKind kind : {AdapterKind::none, AdapterKind::lora, AdapterKind::dora})
      for (const DType gemm : {DType::f32, DType::bf16}) {
        if (gemm == DType::bf16 && !cpu_features().avx512_bf16) continue;
        const std::string what = std::string(gemma ? "gemma3" : "llama") + ", adapter " +
                                 std::to_string(int(kind)) + ", " + std::string(dtype_name(gemm));
        auto be = make_cpu_backend();
        DecoderOptions o = small_decoder(gemma, kind);
        o.num_layers = 3;
        o.sliding = {true, false, true};
        if (kind != AdapterKind::none) o.adapter.dropout = 0.3;  // recomputed with its masks
        auto kept = make_small_decoder(*be, o);
        o.checkpoint_activations = true;
        auto recomputed = make_small_decoder(*be, o);
        kept->set_gemm_dtype(gemm);
        recomputed->set_gemm_dtype(gemm);
        for (int step = 0; step < 2; ++step) {  // the second reuses the shared set
          const auto [logits, grads] = decoder_step(*be, *kept, true);
          const auto [logits2, grads2] = decoder_step(*be, *recomputed, true);
          EXPECT_EQ(logits, logits2) << what;
          EXPECT_EQ(grads, grads2) << what;
        }
        if (kind != AdapterKind::none) continue;
        const HostTensor ids(*be, DType::i64, {1, 7}, {1, 4, 2, 8, 5, 7, 3});
        Rng rng(0);
        const std::vector<double> full =
            to_doubles(*be, recomputed->forward(*be, ids.t, false, rng));
        recomputed->decode_start(*be, 7);
        EXPECT_LE(max_rel_error(to_doubles(*be, recomputed->decode(*be, ids.t)), full), 1e-5)
            << what;
      }
}

// bf16 GEMMs (bf16 operands, f32 accumulation, f32 parameters): the CPU backend follows the
// reference backend's logits and gradients from the same bf16 operands far more closely than
// bf16 follows f32; at HF's initialisation scale they follow f32 GEMMs to bf16's rounding, and
// differ from them (the bf16 path ran); with and without adapters (and adapter dropout, whose W0
// on the dropped-out part is in bf16 too), and a bf16 model decodes as its full pass does.
//
// Not to 1e-3: the backends' f32 values differ in their last bits (their sums run in other
// orders), so now and then one of them lands on the other side of a bf16 rounding midpoint, and
// that operand's step of 2^-8 moves everything computed from it; at this test's weight scale (0.3)
// that took the worst logit or gradient past 1e-3 (up to 4e-2) in up to 4 of 40 random models of
// each kind, and this test's gemma3 DoRA with dropout to 1.7e-2 on a Zen 5 EPYC. So each distance
// (L2, relative) is judged against bf16's own from f32 on the same model: over 400 random models
// one such step came to at most 0.31 of it, where a CPU that truncated to bf16 rather than
// rounding came to 1.6 to 2.8 in every case here.
TEST(Decoder, Bf16GemmsFollowTheReferenceAndF32) {
  SF_SKIP_WITHOUT_BF16();
  // Logits and gradients of `o` on the CPU and reference backends in bf16 and on the reference
  // in f32: the CPU's distance from the reference within half of bf16's from f32.
  const auto expect_follows = [](const DecoderOptions& o, bool training, const std::string& what) {
    auto cpu = make_cpu_backend(), ref = make_reference_backend();
    auto low = make_small_decoder(*cpu, o), low_ref = make_small_decoder(*ref, o);
    auto full_ref = make_small_decoder(*ref, o);
    low->set_gemm_dtype(DType::bf16);
    low_ref->set_gemm_dtype(DType::bf16);
    const auto [logits, grads] = decoder_step(*cpu, *low, training);
    const auto [ref_logits, ref_grads] = decoder_step(*ref, *low_ref, training);
    const auto [f32_logits, f32_grads] = decoder_step(*ref, *full_ref, training);
    const double logit_gap = relative_l2(ref_logits, f32_logits);
    const double grad_gap = relative_l2(ref_grads, f32_grads);
    EXPECT_GT(logit_gap, 1e-5) << what;  // the bf16 path ran, and the yardsticks are not 0
    EXPECT_GT(grad_gap, 1e-5) << what;
    EXPECT_LE(relative_l2(logits, ref_logits), 0.5 * logit_gap) << what;
    EXPECT_LE(relative_l2(grads, ref_grads), 0.5 * grad_gap) << what;
    return logits;
  };
  for (const bool gemma : {false, true})
    for (const AdapterKind kind : {AdapterKind::none, AdapterKind::lora, AdapterKind::dora}) {
      const std::string what =
          std::string(gemma ? "gemma3" : "llama") + ", adapter " + std::to_string(int(kind));
      DecoderOptions o = small_decoder(gemma, kind);
      auto cpu = make_cpu_backend();
      const std::vector<double> logits = expect_follows(o, false, what);
      if (kind != AdapterKind::none) {
        DecoderOptions d = o;
        d.adapter.dropout = 0.3;
        EXPECT_NE(expect_follows(d, true, what + " with dropout"), logits)
            << what << ": the masks changed nothing";
      }

      o.initializer_range = 0.02;
      auto f32 = make_small_decoder(*cpu, o), bf16 = make_small_decoder(*cpu, o);
      bf16->set_gemm_dtype(DType::bf16);
      const auto [want_logits, want_grads] = decoder_step(*cpu, *f32);
      const auto [got_logits, got_grads] = decoder_step(*cpu, *bf16);
      const double logit_gap = relative_l2(got_logits, want_logits);
      const double grad_gap = relative_l2(got_grads, want_grads);
      std::printf("decoder bf16 vs fp32 (%s): logits %.1e, gradients %.1e\n", what.c_str(),
                  logit_gap, grad_gap);
      EXPECT_LE(logit_gap, 1e-2) << what;
      EXPECT_GT(logit_gap, 1e-7) << what;
      EXPECT_LE(grad_gap, 2e-2) << what;
      EXPECT_GT(grad_gap, 1e-7) << what;

      if (kind == AdapterKind::none) continue;
      // Decoding reads the same bf16 weights: the full pass's logits of one row, token by token.
      const HostTensor row(*cpu, DType::i64, {1, 9}, {2, 7, 1, 6, 0, 5, 10, 4, 9});
      Rng rng(1);
      const std::vector<double> want = to_doubles(*cpu, bf16->forward(*cpu, row.t, false, rng));
      bf16->decode_start(*cpu, 9);
      std::vector<double> got;
      for (const double id : {2, 7, 1, 6, 0, 5, 10, 4, 9}) {
        const HostTensor one(*cpu, DType::i64, {1, 1}, {id});
        for (double v : to_doubles(*cpu, bf16->decode(*cpu, one.t))) got.push_back(v);
      }
      // One row's GEMMs and 150 rows' sum in different orders wherever a provider's kernel
      // depends on the row count (oneDNN's: 3.8e-6 to 8.7e-6 here, and to 1.03e-5 where the
      // race gives some shapes to another provider); a wrong cache is off by far more.
      EXPECT_LE(max_rel_error(got, want), 3e-5) << what;
    }
}

// A base held in bf16 (adapter.base_precision) is what bf16 GEMMs read of an f32 base: the same
// logits and adapter gradients under LoRA; under DoRA, whose V = W0 + s B A (and its starting
// magnitudes) come from the rounded W0, the same to bf16's rounding. It needs bf16 GEMMs.
TEST(Decoder, BaseHeldInBf16GivesTheStepOfBf16Gemms) {
  SF_SKIP_WITHOUT_BF16();
  for (const bool gemma : {false, true})
    for (const AdapterKind kind : {AdapterKind::lora, AdapterKind::dora}) {
      const std::string what =
          std::string(gemma ? "gemma3" : "llama") + ", adapter " + std::to_string(int(kind));
      auto be = make_cpu_backend();
      DecoderOptions o = small_decoder(gemma, kind);
      o.initializer_range = 0.02;
      auto f32_base = make_small_decoder(*be, o);
      o.adapter.bf16_base = true;
      auto bf16_base = make_small_decoder(*be, o);
      for (size_t i = 0; i < bf16_base->parameters().size(); ++i) {
        const std::string& name = bf16_base->parameters().values().entries()[i].name;
        const bool linear = name.starts_with("model.layers.") && name.ends_with("proj.weight");
        EXPECT_EQ(bf16_base->parameters().value(i).dtype(), linear ? DType::bf16 : DType::f32)
            << name;
      }
      EXPECT_NE(test::error_of([&] {
                  decoder_step(*be, *bf16_base);
                }).find("adapter.base_precision bf16: a base held in bf16 needs bf16 GEMMs"),
                std::string::npos)
          << what;
      f32_base->set_gemm_dtype(DType::bf16);
      bf16_base->set_gemm_dtype(DType::bf16);
      const auto [want_logits, want_grads] = decoder_step(*be, *f32_base);
      const auto [got_logits, got_grads] = decoder_step(*be, *bf16_base);
      if (kind == AdapterKind::lora) {
        EXPECT_LE(max_rel_error(got_logits, want_logits), 1e-5) << what;
        EXPECT_LE(max_rel_error(got_grads, want_grads), 1e-5) << what;
      } else {
        EXPECT_LE(relative_l2(got_logits, want_logits), 1e-2) << what;
        EXPECT_LE(relative_l2(got_grads, want_grads), 2e-2) << what;
      }
    }
}

// A folder with something seqforge cannot honour is one error naming it.
TEST(Decoder, BadFoldersAreOneErrorNamingTheField) {
  const std::vector<std::string> names = fixture_names();
  ASSERT_FALSE(names.empty());
  const fs::path src = fs::path(fixture_dir()) / names[0];
  const fs::path dir =
      fs::temp_directory_path() / ("seqforge_bad_folder_" + std::to_string(getpid()));
  const auto fresh = [&] {
    fs::remove_all(dir);
    fs::copy(src, dir, fs::copy_options::recursive);
  };
  const auto edit_config = [&](const std::string& from, const std::string& to) {
    std::ifstream in(dir / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(dir / "config.json") << text;
  };
  const auto error = [&] {
    return test::error_of([&] {
      auto be = make_reference_backend();
      Decoder model(read_decoder_config((dir / "config.json").string()), DType::f64);
      model.initialize(*be, 0);
      load_hf_weights(dir.string(), model, *be);
    });
  };
  fresh();
  edit_config("\"rms_norm_eps\"", "\"use_magic\": true, \"rms_norm_eps\"");
  EXPECT_NE(error().find("field 'use_magic' is not known to seqforge"), std::string::npos)
      << error();
  fresh();  // SmolLM2's own fields
  edit_config("\"rms_norm_eps\"",
              "\"is_llama_config\": true, \"rope_interleaved\": false, \"rms_norm_eps\"");
  EXPECT_EQ(error(), "");
  fresh();
  edit_config("\"rms_norm_eps\"", "\"rope_interleaved\": true, \"rms_norm_eps\"");
  EXPECT_NE(error().find("rope_interleaved true is not supported"), std::string::npos) << error();
  fresh();
  edit_config("\"model_type\": \"llama\"", "\"model_type\": \"mamba\"");
  EXPECT_NE(error().find("model_type 'mamba' is not supported"), std::string::npos) << error();
  fresh();
  edit_config("\"rope_scaling\": null",
              "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}");
  EXPECT_NE(error().find("rope_type 'yarn' is not supported"), std::string::npos) << error();
  fresh();
  edit_config("\"intermediate_size\": 40", "\"intermediate_size\": 41");
  EXPECT_NE(error().find("tensor 'model.layers.0.mlp.gate_proj.weight' has shape (40, 24)"),
            std::string::npos)
      << error();
  fresh();
  edit_config("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
  EXPECT_NE(error().find("tensor 'model.layers.2.input_layernorm.weight' (24) is missing"),
            std::string::npos)
      << error();
  fresh();
  edit_config("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
  EXPECT_NE(error().find("tensor 'model.layers.1.input_layernorm.weight' is not part of this "
                         "llama model"),
            std::string::npos)
      << error();
  // Values that would train into NaN or overflow are refused by name.
  const auto set_field = [&](const fs::path& from, const std::string& key,
                             const nlohmann::json& value) {
    fs::remove_all(dir);
    fs::copy(from, dir, fs::copy_options::recursive);
    std::ifstream in(dir / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config[key] = value;
    std::ofstream(dir / "config.json") << config.dump();
  };
  set_field(src, "rms_norm_eps", -1e-6);
  EXPECT_NE(error().find("rms_norm_eps must not be negative"), std::string::npos) << error();
  set_field(src, "initializer_range", -0.02);
  EXPECT_NE(error().find("initializer_range must not be negative"), std::string::npos) << error();
  // A model too large for memory is refused from its config.json, before any of it is built.
  set_field(src, "num_hidden_layers", 1000000000);
  EXPECT_NE(error().find("num_hidden_layers 1000000000) needs"), std::string::npos) << error();
  EXPECT_NE(error().find("MB for its values alone even in bf16, more than the"), std::string::npos)
      << error();
  set_field(src, "rope_scaling",
            {{"rope_type", "llama3"},
             {"factor", 8.0},
             {"low_freq_factor", 1.0},
             {"high_freq_factor", 4.0},
             {"original_max_position_embeddings", 1e300}});
  EXPECT_NE(error().find("original_max_position_embeddings must be a positive integer"),
            std::string::npos)
      << error();
  const auto gemma = std::find_if(names.begin(), names.end(),
                                  [](const std::string& n) { return n.rfind("gemma3", 0) == 0; });
  ASSERT_NE(gemma, names.end());
  set_field(fs::path(fixture_dir()) / *gemma, "rope_local_base_freq", -3.0);
  EXPECT_NE(error().find("rope_local_base_freq must exceed 1"), std::string::npos) << error();
  // A folder with model.safetensors and an index beside it is read from model.safetensors, as
  // transformers reads it.
  bool sharded = false;
  for (const std::string& n : names) {
    if (!fs::exists(fs::path(fixture_dir()) / n / "model.safetensors.index.json")) continue;
    sharded = true;
    fs::remove_all(dir);
    fs::copy(fs::path(fixture_dir()) / n, dir, fs::copy_options::recursive);
    std::ofstream(dir / "model.safetensors") << "not the shards";
    EXPECT_NE(error().find((dir / "model.safetensors").string()), std::string::npos) << error();
    break;
  }
  EXPECT_TRUE(sharded) << "no sharded fixture in " << fixture_dir();
  fs::remove_all(dir);
}

// A tied model's folder that also holds lm_head.weight: the same values tie as usual; different
// ones are refused (transformers 4 would serve the embedding, transformers 5 the head).
TEST(Decoder, TiedHeadGivenTwiceMustAgree) {
  std::string tied;
  for (const std::string& n : fixture_names()) {
    const fs::path folder = fs::path(fixture_dir()) / n;
    std::ifstream in(folder / "config.json");
    if (fs::exists(folder / "model.safetensors") &&
        nlohmann::json::parse(in).value("tie_word_embeddings", false))
      tied = n;
  }
  ASSERT_FALSE(tied.empty()) << "no tied, unsharded fixture in " << fixture_dir();
  const fs::path dir =
      fs::temp_directory_path() / ("seqforge_tied_folder_" + std::to_string(getpid()));
  const auto load_with_head = [&](float change) {
    fs::remove_all(dir);
    fs::copy(fs::path(fixture_dir()) / tied, dir, fs::copy_options::recursive);
    const io::SafetensorsFile file =
        io::SafetensorsFile::read((dir / "model.safetensors").string());
    std::vector<io::SafetensorsTensor> tensors;
    std::vector<float> head;
    for (const io::SafetensorsEntry& e : file.entries()) {
      tensors.push_back({e.name, e.dtype, e.shape, file.bytes(e).data()});
      if (e.name != "model.embed_tokens.weight") continue;
      head.resize(size_t(Shape(e.shape).numel()));
      convert(file.bytes(e).data(), e.dtype, head.data(), DType::f32, head.size());
      head[head.size() / 2] += change;
      tensors.push_back({"lm_head.weight", DType::f32, e.shape, head.data()});
    }
    io::write_safetensors((dir / "model.safetensors").string(), tensors);
    return test::error_of([&] {
      auto be = make_reference_backend();
      Decoder model(read_decoder_config((dir / "config.json").string()), DType::f64);
      model.initialize(*be, 0);
      load_hf_weights(dir.string(), model, *be);
    });
  };
  EXPECT_EQ(load_with_head(0), "");
  const std::string e = load_with_head(0.5f);
  EXPECT_NE(e.find("ties the head to the embedding (tie_word_embeddings true) but "
                   "'lm_head.weight' differs from 'model.embed_tokens.weight'"),
            std::string::npos)
      << e;
  fs::remove_all(dir);
}

// Qwen2: layer_types naming sliding layers needs use_sliding_window (transformers raises too), and
// a layer type that is neither kind is one error.
TEST(Decoder, Qwen2LayerTypesAreCheckedAgainstUseSlidingWindow) {
  std::string qwen;
  for (const std::string& n : fixture_names())
    if (n.rfind("qwen2", 0) == 0) qwen = n;
  ASSERT_FALSE(qwen.empty()) << "no Qwen2 fixture in " << fixture_dir();
  const fs::path config_path = fs::path(fixture_dir()) / qwen / "config.json";
  std::ifstream in(config_path);
  nlohmann::json config = nlohmann::json::parse(in);
  config.erase("layer_types");
  const fs::path path =
      fs::temp_directory_path() / ("seqforge_qwen2_config_" + std::to_string(getpid()) + ".json");
  const auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = config;
    edit(c);
    std::ofstream(path) << c.dump();
    return test::error_of([&] { read_decoder_config(path.string()); });
  };
  const int64_t layers = config["num_hidden_layers"].get<int64_t>();
  std::string e = error_with([&](nlohmann::json& c) {
    c["use_sliding_window"] = false;
    c["layer_types"] = std::vector<std::string>(size_t(layers), "sliding_attention");
  });
  EXPECT_NE(e.find("layer_types names sliding_attention layers but use_sliding_window is false"),
            std::string::npos)
      << e;
  e = error_with([&](nlohmann::json& c) {
    c["use_sliding_window"] = true;
    c["sliding_window"] = nullptr;
    c["layer_types"] = std::vector<std::string>(size_t(layers), "sliding_attention");
  });
  EXPECT_NE(e.find("sliding_window null"), std::string::npos) << e;
  e = error_with([&](nlohmann::json& c) {
    c["layer_types"] = std::vector<std::string>(size_t(layers), "chunked_attention");
  });
  EXPECT_NE(e.find("layer_types: \"chunked_attention\" is neither"), std::string::npos) << e;
  e = error_with([&](nlohmann::json& c) {
    c["use_sliding_window"] = true;
    c["max_window_layers"] = -1;
  });
  EXPECT_NE(e.find("max_window_layers must be a non-negative integer"), std::string::npos) << e;
  // Without use_sliding_window no layer is windowed, whatever max_window_layers says.
  std::ofstream(path) << [&] {
    nlohmann::json c = config;
    c["use_sliding_window"] = false;
    c["max_window_layers"] = 0;
    return c.dump();
  }();
  const DecoderOptions plain = read_decoder_config(path.string());
  EXPECT_EQ(std::count(plain.sliding.begin(), plain.sliding.end(), true), 0);
  // use_sliding_window with sliding_window null: transformers then windows no layer either.
  std::ofstream(path) << [&] {
    nlohmann::json c = config;
    c["use_sliding_window"] = true;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = 0;
    return c.dump();
  }();
  const DecoderOptions unset = read_decoder_config(path.string());
  EXPECT_EQ(std::count(unset.sliding.begin(), unset.sliding.end(), true), 0);
  EXPECT_EQ(unset.sliding_window, 0);
  std::ofstream(path) << [&] {
    nlohmann::json c = config;
    c["use_sliding_window"] = true;
    c["sliding_window"] = 7;
    c["max_window_layers"] = layers - 1;
    return c.dump();
  }();
  const DecoderOptions windowed = read_decoder_config(path.string());
  ASSERT_EQ(int64_t(windowed.sliding.size()), layers);
  EXPECT_EQ(windowed.sliding_window, 7);
  for (int64_t i = 0; i < layers; ++i) EXPECT_EQ(windowed.sliding[size_t(i)], i == layers - 1) << i;
  fs::remove(path);
}

// Gemma 3: soft-capping is read (the parity fixtures check what it does); a cap that is not
// positive is refused by name.
TEST(Decoder, Gemma3SoftCappingIsReadAndChecked) {
  std::string gemma;
  for (const std::string& n : fixture_names())
    if (n.rfind("gemma3", 0) == 0) gemma = n;
  ASSERT_FALSE(gemma.empty()) << "no Gemma 3 fixture in " << fixture_dir();
  const fs::path dir =
      fs::temp_directory_path() / ("seqforge_gemma_folder_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(fs::path(fixture_dir()) / gemma, dir, fs::copy_options::recursive);
  std::ifstream in(dir / "config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json config = nlohmann::json::parse(text);
  config["final_logit_softcapping"] = 30.0;
  config["attn_logit_softcapping"] = 50.0;
  std::ofstream(dir / "config.json") << config.dump();
  const DecoderOptions o = read_decoder_config((dir / "config.json").string());
  EXPECT_EQ(o.final_logit_softcapping, 30.0);
  EXPECT_EQ(o.attn_logit_softcapping, 50.0);
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
    for (const double bad : {0.0, -1.0}) {
      nlohmann::json c = config;
      c[key] = bad;
      std::ofstream(dir / "config.json") << c.dump();
      const std::string e =
          test::error_of([&] { read_decoder_config((dir / "config.json").string()); });
      EXPECT_NE(e.find(std::string(key) + " must be positive or null"), std::string::npos) << e;
    }
  // Keys a config leaves out take transformers' Gemma3TextConfig defaults, not Llama's.
  for (const char* key : {"rope_theta", "query_pre_attn_scalar", "head_dim", "num_key_value_heads",
                          "max_position_embeddings"})
    config.erase(key);
  std::ofstream(dir / "config.json") << config.dump();
  const DecoderOptions defaults = read_decoder_config((dir / "config.json").string());
  EXPECT_EQ(defaults.rope_theta, 1e6);
  EXPECT_EQ(defaults.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(defaults.head_dim, 256);
  EXPECT_EQ(defaults.num_kv_heads, 4);
  EXPECT_EQ(defaults.max_positions, 131072);
  fs::remove_all(dir);
}

// transformers 5 writes the rotations as rope_parameters (for Gemma 3 one object per layer type):
// read as the same rotations as transformers 4's rope_theta, rope_local_base_freq and
// rope_scaling; the two forms disagreeing, or a rotation seqforge does not apply, are refused.
TEST(Decoder, TransformersFiveRopeParametersAreTheFourFields) {
  const fs::path path =
      fs::temp_directory_path() / ("seqforge_rope_config_" + std::to_string(getpid()) + ".json");
  const auto write = [&](const nlohmann::json& c) { std::ofstream(path) << c.dump(); };
  const auto read = [&](const nlohmann::json& c) {
    write(c);
    return read_decoder_config(path.string());
  };
  const auto error = [&](const nlohmann::json& c) {
    write(c);
    return test::error_of([&] { read_decoder_config(path.string()); });
  };
  const nlohmann::json llama = {{"model_type", "llama"},  {"vocab_size", 32},
                                {"hidden_size", 16},      {"intermediate_size", 32},
                                {"num_hidden_layers", 2}, {"num_attention_heads", 2}};
  const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                 {"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 16}};
  nlohmann::json v4 = llama, v5 = llama;
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = llama3;
  v5["rope_parameters"] = llama3;
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  const DecoderOptions four = read(v4), five = read(v5);
  EXPECT_EQ(five.rope_theta, 500000.0);
  EXPECT_TRUE(five.rope_scaling.llama3);
  EXPECT_EQ(five.rope_scaling.original_max_position_embeddings, 16);
  EXPECT_EQ(rope_inverse_frequencies(four), rope_inverse_frequencies(five));
  EXPECT_NE(rope_inverse_frequencies(five), rope_inverse_frequencies(read(llama)));
  nlohmann::json plain = llama;
  plain["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 20000.0}};
  EXPECT_EQ(read(plain).rope_theta, 20000.0);
  EXPECT_FALSE(read(plain).rope_scaling.llama3 || read(plain).rope_scaling.linear);

  const nlohmann::json gemma = {{"model_type", "gemma3_text"}, {"vocab_size", 32},
                                {"hidden_size", 16},           {"intermediate_size", 32},
                                {"num_hidden_layers", 2},      {"num_attention_heads", 2},
                                {"num_key_value_heads", 1},    {"head_dim", 8}};
  nlohmann::json g4 = gemma, g5 = gemma;
  g4["rope_theta"] = 1e6;
  g4["rope_local_base_freq"] = 5e4;
  g4["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  g5["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5e4}}}};
  const DecoderOptions gemma4 = read(g4), gemma5 = read(g5);
  EXPECT_EQ(gemma5.rope_local_theta, 5e4);
  EXPECT_TRUE(gemma5.rope_scaling.linear);
  for (const bool local : {false, true})
    EXPECT_EQ(rope_inverse_frequencies(gemma4, local), rope_inverse_frequencies(gemma5, local));

  const auto refused = [&](nlohmann::json c, const std::string& expected) {
    const std::string e = error(c);
    EXPECT_NE(e.find(expected), std::string::npos) << e;
  };
  nlohmann::json c = v5;
  c["rope_scaling"] = llama3;
  refused(c, "give rope_parameters (transformers 5) or rope_scaling (transformers 4), not both");
  c = v5;
  c["rope_theta"] = 10000.0;
  refused(c, "rope_theta (10000) and rope_parameters' rope_theta (500000) differ");
  c = v5;
  c["rope_parameters"]["partial_rotary_factor"] = 0.5;
  refused(c, "rope_parameters.partial_rotary_factor is not supported");
  c = v5;
  c["rope_parameters"]["beta_fast"] = 32;
  refused(c, "rope_parameters: field 'beta_fast' is not known to seqforge");
  c = llama;
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  refused(c, "rope_parameters: rope_type 'yarn' is not supported");
  // transformers 4 reads "type" for Llama and "rope_type" for Gemma 3; given both, they agree.
  c = v4;
  c["rope_scaling"]["type"] = "linear";
  refused(c, "rope_scaling: rope_type 'llama3' and type 'linear' disagree");
  c = g4;
  c["rope_scaling"]["type"] = "default";
  refused(c, "rope_scaling: rope_type 'linear' and type 'default' disagree");
  c["rope_scaling"]["type"] = "linear";
  EXPECT_TRUE(read(c).rope_scaling.linear);
  c["rope_scaling"]["type"] = 1;
  refused(c, "rope_scaling.type must be a string, got 1");
  c["rope_scaling"]["type"] = nullptr;  // null: not given
  EXPECT_TRUE(read(c).rope_scaling.linear);
  c = llama;
  c["rope_parameters"] = g5["rope_parameters"];
  refused(c, "rotations per layer type are read for gemma3_text models only");
  c = gemma;
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  refused(c, "must hold full_attention and sliding_attention objects for a gemma3_text model");
  c = g5;
  c["rope_parameters"]["sliding_attention"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  refused(c, "sliding_attention: seqforge applies the default rotation to local layers");
  c = g5;
  c["rope_local_base_freq"] = 1e4;
  refused(c, "rope_local_base_freq (10000) and rope_parameters.sliding_attention's rope_theta");
  fs::remove(path);
}

}  // namespace
}  // namespace seqforge::decoder_parity_test
