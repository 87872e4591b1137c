#pragma once
// seqforge: fast training of LSTM-family sequence models. The umbrella header.
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/arena.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/core/tensor.hpp"
#include "seqforge/core/threads.hpp"
#include "seqforge/nn/checkpoint.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/layers.hpp"
#include "seqforge/nn/recurrent.hpp"
#include "seqforge/nn/parameters.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/optim/optimizer.hpp"

namespace seqforge {
const char* version();
}
