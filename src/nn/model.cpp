#include "seqforge/nn/model.hpp"

#include "seqforge/nn/decoder.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/nn/transformer.hpp"

namespace seqforge {

std::vector<Op> ops_needed(const ModelOptions& options) {
  std::vector<Op> needs = {Op::memory,  Op::gemm,      Op::elementwise, Op::layout,
                           Op::dropout, Op::embedding, Op::loss,        Op::optimizer};
  if (options.family == ModelFamily::transformer) {
    for (Op op : {Op::norm, Op::activation, Op::attention}) needs.push_back(op);
  } else if (options.family == ModelFamily::decoder) {
    for (Op op : {Op::decoder, Op::attention}) needs.push_back(op);
  } else {
    needs.push_back(Op::cell);
  }
  const AdapterKind adapter =
      options.family == ModelFamily::decoder ? options.decoder.adapter.kind : options.adapter.kind;
  if (adapter != AdapterKind::none) needs.push_back(Op::adapter);
  return needs;
}

std::unique_ptr<Model> make_model(const ModelOptions& options, DType dtype) {
  if (options.family == ModelFamily::transformer) {
    TransformerOptions t = options.transformer;
    t.vocab_size = options.vocab_size;
    t.adapter = options.adapter;
    return std::make_unique<Transformer>(t, dtype);
  }
  if (options.family == ModelFamily::decoder)
    return std::make_unique<Decoder>(options.decoder, dtype);
  return std::make_unique<SequenceModel>(options, dtype);
}

}  // namespace seqforge
