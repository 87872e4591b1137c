#include "seqforge/nn/parameters.hpp"

#include <vector>

#include "seqforge/backend/backend.hpp"

namespace seqforge {

size_t Parameters::declare(std::string name, Shape shape, Init init) {
  SF_CHECK(!values_.allocated(), "parameter ", name, " declared after allocation");
  inits_.push_back(init);
  fixed_.push_back(false);
  return values_.add(std::move(name), shape);
}

void Parameters::fix(size_t i) { fix(i, dtype()); }

void Parameters::fix(size_t i, DType storage) {
  SF_CHECK(!values_.allocated() && i < size(), "fixing parameter ", i, " of ", size());
  fixed_[i] = true;
  values_.set_dtype(i, storage);
}

void Parameters::allocate(Backend& backend, Rng& rng) {
  for (size_t i = 0; i < size(); ++i) {
    const Arena::Entry& e = values_.entries()[i];
    grads_.add(e.name, fixed_[i] ? Shape{0} : e.shape);
  }
  values_.allocate(backend);
  grads_.allocate(backend);
  // Drawn and uploaded a block at a time: a host copy of the largest tensor (an LLM's embedding
  // of 300M values) would cost gigabytes at its peak.
  constexpr int64_t kBlock = int64_t{1} << 20;
  std::vector<double> host;
  std::vector<char> converted;
  for (size_t i = 0; i < size(); ++i) {
    const Tensor flat = values_.view(i).reshape({values_.view(i).numel()});
    const Init& init = inits_[i];
    for (int64_t begin = 0; begin < flat.numel(); begin += kBlock) {
      const Tensor block = flat.slice(begin, std::min(flat.numel(), begin + kBlock));
      host.assign(static_cast<size_t>(block.numel()), 0.0);
      for (double& x : host) {
        if (init.kind == Init::uniform) x = rng.uniform(init.a, init.b);
        if (init.kind == Init::normal) x = init.a + init.b * rng.normal();
        if (init.kind == Init::constant) x = init.a;
      }
      converted.resize(block.nbytes());
      convert(host.data(), DType::f64, converted.data(), block.dtype(), host.size());
      backend.upload(block, converted.data());
    }
  }
}

void Parameters::zero_grad(Backend& backend) { backend.fill(grads_.flat(), 0.0); }

int64_t Parameters::count() const {
  int64_t n = 0;
  for (const auto& e : values_.entries()) n += e.shape.numel();
  return n;
}

}  // namespace seqforge
