// The launchers (launch.hpp) of the recurrent cells' steps and whole-chain recurrences.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/cuda/cells.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/lnlstm.cuh"
#include "kernels/cuda/recurrence.cuh"

namespace seqforge::cuda {

void cell_forward(CellKind cell, const CellForward& p, DType dtype, cudaStream_t stream) {
  const int64_t n = p.batch * p.hidden;
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    if (cell == CellKind::lstm)
      return SF_LAUNCH(blocks_for(n), kThreads, 0, stream, lstm_forward_kernel<T>)(p);
    if (cell == CellKind::gru)
      return SF_LAUNCH(blocks_for(n), kThreads, 0, stream, gru_forward_kernel<T>)(p);
    const unsigned rows = static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535);
    const size_t shared = 4 * p.hidden * sizeof(T);
    allow_shared(lnlstm_forward_kernel<T>, shared, "the LN-LSTM cell's forward step");
    SF_LAUNCH(rows, kThreads, shared, stream, lnlstm_forward_kernel<T>)(p);
  });
}

void cell_backward(CellKind cell, const CellBackward& p, void* dbias_rows, DType dtype,
                   cudaStream_t stream) {
  const int64_t n = p.batch * p.hidden;
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    if (cell == CellKind::lstm)
      return SF_LAUNCH(blocks_for(n), kThreads, 0, stream, lstm_backward_kernel<T>)(p);
    if (cell == CellKind::gru)
      return SF_LAUNCH(blocks_for(n), kThreads, 0, stream, gru_backward_kernel<T>)(p);
    const unsigned rows = static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535);
    const size_t shared = 5 * p.hidden * sizeof(T);
    allow_shared(lnlstm_backward_kernel<T>, shared, "the LN-LSTM cell's backward step");
    SF_LAUNCH(rows, kThreads, shared, stream, lnlstm_backward_kernel<T>)
    (p, static_cast<T*>(dbias_rows));
  });
}

namespace {

// A whole-chain launch's plan and blocks: the largest chunk of K (all of it, or a multiple of 8)
// whose staging fits the GPU's shared memory per block, with W_hh's slice resident when it fits
// too and every tile can have a block of its own; no more blocks than the GPU holds at once (the
// blocks wait for each other). `elements(plan)` is the shared memory a plan needs. None where
// not even the smallest chunk fits.
template <typename T, typename Kernel, typename Elements>
std::optional<std::pair<RecurrencePlan, unsigned>> try_plan_recurrence(
    Kernel kernel, int64_t k_total, int64_t tiles, Elements elements, const char* what) {
  auto check = [&](cudaError_t e, const char* query) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    fail("cuda: ", what, ": ", query, " failed: ", cudaGetErrorName(e));
  };
  int device = 0, sms = 0, cooperative = 0, optin = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "the multiprocessor count");
  check(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device),
        "the cooperative launch attribute");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "the shared memory per block");
  if (!cooperative) fail("cuda: ", what, ": this GPU has no cooperative launches");
  for (const bool resident : {true, false}) {
    RecurrencePlan plan{static_cast<int>(k_total), resident};
    auto bytes = [&] { return static_cast<size_t>(elements(plan)) * sizeof(T); };
    while (bytes() > static_cast<size_t>(optin) && plan.chunk > 8)
      plan.chunk = std::max(8, (plan.chunk / 2 + 7) / 8 * 8);
    if (bytes() > static_cast<size_t>(optin)) continue;
    allow_shared(kernel, bytes(), what);
    int per_sm = 0;
    check(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kRecurrenceThreads, bytes()),
        "the occupancy query");
    const int64_t capacity = int64_t{per_sm} * sms;
    if (per_sm < 1 || (resident && tiles > capacity)) continue;
    return std::pair{plan, static_cast<unsigned>(std::min(tiles, capacity))};
  }
  return std::nullopt;
}

template <typename T, typename Kernel, typename Elements>
std::pair<RecurrencePlan, unsigned> plan_recurrence(Kernel kernel, int64_t k_total, int64_t tiles,
                                                    Elements elements, const char* what) {
  if (const auto plan = try_plan_recurrence<T>(kernel, k_total, tiles, elements, what))
    return *plan;
  fail("cuda: ", what,
       " needs more shared memory than this GPU offers a block; use a narrower "
       "model.hidden or train.device: cpu");
}

}  // namespace

int64_t recurrence_bias_rows(int64_t batch) { return tile_groups(batch, kTileRows); }

int64_t recurrence_progress_bytes(int64_t batch) {
  return kMaxChains * tile_groups(batch, kTileRows) * int64_t{sizeof(unsigned)};
}

namespace {

// SEQFORGE_CUDA_CHAIN_SYNC: how a whole-chain launch's steps wait for each other, `grid` syncs
// (the default) or `row_groups` counters (recurrence.cuh), off until they have run on a GPU.
bool row_group_waits() {
  const char* choice = std::getenv("SEQFORGE_CUDA_CHAIN_SYNC");
  if (!choice || std::string_view(choice) == "" || std::string_view(choice) == "grid") return false;
  if (std::string_view(choice) != "row_groups")
    fail("SEQFORGE_CUDA_CHAIN_SYNC: unknown value '", choice, "' (expected grid or row_groups)");
  return true;
}

// A launch's progress counters, zeroed on the stream, or none (grid syncs).
unsigned* progress_counters(void* progress, int chains, int64_t batch, cudaStream_t stream) {
  if (!row_group_waits()) return nullptr;
  const size_t bytes =
      static_cast<size_t>(chains * tile_groups(batch, kTileRows)) * sizeof(unsigned);
  cudaMemsetAsync(progress, 0, bytes, stream);
  return static_cast<unsigned*>(progress);
}

}  // namespace

namespace {

static_assert(kMaxChains == recurrence_chains_together);

// The launches' groups of chains, `together` (at most kMaxChains) at a time, all of one batch,
// width and length.
template <typename Chain>
std::vector<Chains<Chain>> chain_groups(std::span<const Chain> chains, int together) {
  std::vector<Chains<Chain>> groups;
  for (const Chain& c : chains) {
    const Chain& first = chains.front();
    SF_CHECK(c.cell.batch == first.cell.batch && c.cell.hidden == first.cell.hidden &&
                 c.steps == first.steps && c.gemm == first.gemm,
             "cuda: chains run together need one batch, width, length and product dtype");
    if (groups.empty() || groups.back().count == together) groups.emplace_back();
    groups.back().chain[groups.back().count++] = c;
  }
  return groups;
}

// Launches `kernel` over the chains, `launch(group, plan, blocks)` for each group: together in
// one launch (up to kMaxChains) unless that would cost them their resident weights, which one
// chain alone keeps; then a launch a chain.
// A stack's two chains are always launched together. `elements(plan, stack)`.
template <typename T, typename Chain, typename Kernel, typename Elements, typename Launch>
void launch_chains(std::span<const Chain> chains, Kernel kernel, int64_t k_total, Elements elements,
                   const char* what, Launch&& launch) {
  const int64_t per_chain =
      tile_groups(chains[0].cell.batch, kTileRows) * tile_groups(chains[0].cell.hidden, kTileUnits);
  if (is_stack(chains)) {
    const auto [plan, blocks] = plan_recurrence<T>(
        kernel, k_total, 2 * per_chain, [&](const RecurrencePlan& p) { return elements(p, true); },
        what);
    return launch(chain_groups(chains, 2).front(), plan, blocks);
  }
  const auto single = [&](const RecurrencePlan& p) { return elements(p, false); };
  const int together = static_cast<int>(std::min<int64_t>(chains.size(), kMaxChains));
  const auto joint = plan_recurrence<T>(kernel, k_total, together * per_chain, single, what);
  if (together > 1 && !joint.first.resident) {
    const auto alone = plan_recurrence<T>(kernel, k_total, per_chain, single, what);
    if (alone.first.resident) {
      for (const Chains<Chain>& group : chain_groups(chains, 1))
        launch(group, alone.first, alone.second);
      return;
    }
  }
  for (const Chains<Chain>& group : chain_groups(chains, together)) {
    const auto [plan, blocks] =
        group.count == together
            ? joint
            : plan_recurrence<T>(kernel, k_total, group.count * per_chain, single, what);
    launch(group, plan, blocks);
  }
}

}  // namespace

bool recurrence_stack_together(CellKind cell, int64_t batch, int64_t hidden, DType dtype,
                               bool backward) {
  const int G = cell_type(cell).gates;
  const int64_t per_chain = tile_groups(batch, kTileRows) * tile_groups(hidden, kTileUnits);
  bool together = true;
  dispatch_float(dtype, [&]<typename T>() {
    auto decide = [&](auto kernel, int64_t k_total, auto elements) {
      const char* what =
          backward ? "the recurrence's backward kernel" : "the recurrence's forward kernel";
      const auto stack = try_plan_recurrence<T>(
          kernel, k_total, 2 * per_chain,
          [&](const RecurrencePlan& p) { return elements(p, true); }, what);
      if (stack && stack->first.resident) return;
      const auto alone = try_plan_recurrence<T>(
          kernel, k_total, per_chain, [&](const RecurrencePlan& p) { return elements(p, false); },
          what);
      together = stack && !(alone && alone->first.resident);
    };
    auto run = [&]<int Gates>() {
      if (backward)
        decide(recurrence_backward_kernel<T, Gates>, Gates * hidden,
               [&](const RecurrencePlan& p, bool stack) {
                 return recurrence_backward_shared(Gates, hidden, p, sizeof(T), stack).elements;
               });
      else
        decide(recurrence_forward_kernel<T, Gates>, hidden,
               [&](const RecurrencePlan& p, bool stack) {
                 return recurrence_forward_shared(Gates, hidden, p, sizeof(T), stack).elements;
               });
    };
    if (G == 4)
      run.template operator()<4>();
    else
      run.template operator()<3>();
  });
  return together;
}

void recurrence_forward(CellKind cell, std::span<const RecurrenceForward> chains, DType dtype,
                        void* progress, cudaStream_t stream) {
  if (chains.empty()) return;
  const int64_t B = chains[0].cell.batch, H = chains[0].cell.hidden;
  if (chains[0].steps == 0 || B == 0 || H == 0) return;
  SF_CHECK(cell == CellKind::lstm || cell == CellKind::gru, "cuda: no whole-chain ",
           cell_type(cell).name);
  dispatch_float(dtype, [&]<typename T>() {
    auto run = [&]<int G>() {
      auto elements = [&](const RecurrencePlan& p, bool stack) {
        return recurrence_forward_shared(G, H, p, sizeof(T), stack).elements;
      };
      launch_chains<T>(
          chains, recurrence_forward_kernel<T, G>, H, elements, "the recurrence's forward kernel",
          [&](const Chains<RecurrenceForward>& group, const RecurrencePlan& plan, unsigned blocks) {
            SF_LAUNCH_COOPERATIVE(blocks, kRecurrenceThreads,
                                  elements(plan, stacked(group)) * sizeof(T), stream,
                                  recurrence_forward_kernel<T, G>)
            (group, plan, progress_counters(progress, group.count, B, stream));
          });
    };
    if (cell == CellKind::lstm)
      run.template operator()<4>();
    else
      run.template operator()<3>();
  });
}

void recurrence_backward(CellKind cell, std::span<const RecurrenceBackward> chains,
                         void* dgates_step, void* drec_step, void* bias_rows, void* progress,
                         DType dtype, cudaStream_t stream) {
  if (chains.empty()) return;
  const int64_t B = chains[0].cell.batch, H = chains[0].cell.hidden;
  if (chains[0].steps == 0 || B == 0 || H == 0) return;
  SF_CHECK(cell == CellKind::lstm || cell == CellKind::gru, "cuda: no whole-chain ",
           cell_type(cell).name);
  const bool dbias = chains[0].cell.dbias != nullptr;
  for (const RecurrenceBackward& c : chains)
    SF_CHECK((c.cell.dbias != nullptr) == dbias,
             "cuda: chains run together either all sum their bias gradients or none does");
  dispatch_float(dtype, [&]<typename T>() {
    auto run = [&]<int G>() {
      const int64_t GH = G * H, columns = (G == 3 ? 2 : 1) * GH;
      const int64_t rows = recurrence_bias_rows(B) * columns;  // a chain's bias sums
      auto elements = [&](const RecurrencePlan& p, bool stack) {
        return recurrence_backward_shared(G, H, p, sizeof(T), stack).elements;
      };
      auto launch = [&](const Chains<RecurrenceBackward>& group, const RecurrencePlan& plan,
                        unsigned blocks) {
        if (dbias) cudaMemsetAsync(bias_rows, 0, group.count * rows * sizeof(T), stream);
        unsigned* counters = progress_counters(progress, group.count, B, stream);
        SF_LAUNCH_COOPERATIVE(blocks, kRecurrenceThreads,
                              elements(plan, stacked(group)) * sizeof(T), stream,
                              recurrence_backward_kernel<T, G>)
        (group, plan, static_cast<T*>(dgates_step), static_cast<T*>(drec_step),
         dbias ? static_cast<T*>(bias_rows) : nullptr, counters);
        if (dbias)
          for (int c = 0; c < group.count; ++c)
            sum_rows_acc(group.chain[c].cell.dbias, static_cast<T*>(bias_rows) + c * rows, dtype,
                         recurrence_bias_rows(B), columns, stream);
      };
      launch_chains<T>(chains, recurrence_backward_kernel<T, G>, GH, elements,
                       "the recurrence's backward kernel", launch);
    };
    if (cell == CellKind::lstm)
      run.template operator()<4>();
    else
      run.template operator()<3>();
  });
}

}  // namespace seqforge::cuda
