#pragma once
// Drawing the next token of `generate` from a model's logits.
#include <cstdint>
#include <vector>

#include "seqforge/core/rng.hpp"

namespace seqforge {

// The next token's id from its logits (V): the likeliest (the first of equals) at temperature 0,
// else drawn from softmax(logits / temperature) over the top_k likeliest (0: all; with those
// equal to the k-th, as HF's top_k) and, with top_p < 1, over the fewest likeliest of those whose
// probabilities reach top_p (nucleus sampling, HF's top_p; the likeliest is always kept). A
// logit that is not finite is an error.
int64_t sample_next(const std::vector<float>& row, double temperature, int64_t top_k, Rng& rng,
                    double top_p = 1.0);

}  // namespace seqforge
