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
  for (size_t i = 0; i < size(); ++i) {
    Tensor v = values_.view(i);
    const Init& init = inits_[i];
    std::vector<double> host(static_cast<size_t>(v.numel()), 0.0);
    for (double& x : host) {
      if (init.kind == Init::uniform) x = rng.uniform(init.a, init.b);
      if (init.kind == Init::normal) x = init.a + init.b * rng.normal();
      if (init.kind == Init::constant) x = init.a;
    }
    std::vector<char> converted(v.nbytes());
    convert(host.data(), DType::f64, converted.data(), v.dtype(), host.size());
    backend.upload(v, converted.data());
  }
}

void Parameters::zero_grad(Backend& backend) { backend.fill(grads_.flat(), 0.0); }

int64_t Parameters::count() const {
  int64_t n = 0;
  for (const auto& e : values_.entries()) n += e.shape.numel();
  return n;
}

}  // namespace seqforge
