#include "seqforge/nn/model.hpp"

#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/nn/transformer.hpp"

namespace seqforge {

std::unique_ptr<Model> make_model(const ModelOptions& options, DType dtype) {
  if (options.family == ModelFamily::transformer) {
    TransformerOptions t = options.transformer;
    t.vocab_size = options.vocab_size;
    t.adapter = options.adapter;
    return std::make_unique<Transformer>(t, dtype);
  }
  return std::make_unique<SequenceModel>(options, dtype);
}

}  // namespace seqforge
