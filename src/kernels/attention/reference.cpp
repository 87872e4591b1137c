#include "kernels/attention.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::kernels {

template <typename T>
void attention_forward_reference(const AttentionForward&, int64_t, int64_t) {
  fail("attention_forward_reference: not written yet");
}
template <typename T>
void attention_backward_reference(const AttentionBackward&, int64_t, int64_t) {
  fail("attention_backward_reference: not written yet");
}
template void attention_forward_reference<float>(const AttentionForward&, int64_t, int64_t);
template void attention_forward_reference<double>(const AttentionForward&, int64_t, int64_t);
template void attention_backward_reference<float>(const AttentionBackward&, int64_t, int64_t);
template void attention_backward_reference<double>(const AttentionBackward&, int64_t, int64_t);

}  // namespace seqforge::kernels
