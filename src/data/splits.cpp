#include "data/splits.hpp"

#include <algorithm>
#include <cmath>

#include "seqforge/core/error.hpp"
#include "seqforge/core/rng.hpp"

namespace seqforge {

std::string untrained_classes_note(const std::vector<std::string>& names,
                                   const std::vector<int64_t>& train_classes, const char* item,
                                   double labelled) {
  std::vector<int64_t> count(names.size(), 0);
  for (int64_t c : train_classes)
    if (c >= 0) ++count[size_t(c)];
  std::string listed;
  int64_t untrained = 0;
  for (size_t c = 0; c < count.size(); ++c)
    if (count[c] == 0 && untrained++ < 5) listed += (listed.empty() ? "'" : ", '") + names[c] + "'";
  std::string note;
  if (untrained > 0)
    note = std::to_string(untrained) + " of " + std::to_string(names.size()) + " classes (" +
           listed + (untrained > 5 ? ", ..." : "") + ") in no training " + item +
           ", only in validation or test: the model cannot learn them " +
           (labelled < 1
                ? "(data.label_fraction " + detail::concat(labelled) +
                      " keeps the labels of that share of the training " + item + "s: raise it)"
                : "(data.split.mode: random deals " + std::string(item) +
                      "s of every class to the training split)");
  if (static_cast<int64_t>(names.size()) - untrained == 1) {  // accuracy 1 from one answer
    const auto only = std::find_if(count.begin(), count.end(), [](int64_t n) { return n > 0; });
    note = "every training " + std::string(item) + " is of one class, '" +
           names[size_t(only - count.begin())] +
           "': the model learns to answer it always, whatever its input" +
           (note.empty() ? "" : "; " + note);
  }
  return note;
}

// A share times n that is a whole number in decimal (0.7 + 0.2 of 100) may come out just below
// it in binary: the relative nudge keeps it whole.
std::pair<int64_t, int64_t> boundaries(const SplitOptions& o, int64_t n) {
  auto rows = [&](double share) {
    return static_cast<int64_t>(std::floor(share * double(n) * (1 + 1e-12)));
  };
  const int64_t a = rows(o.train);
  const int64_t b = std::min<int64_t>(n, rows(o.train + o.val));
  return {a, b};
}

void random_split(const SplitOptions& o, std::vector<int64_t> all, Split* out) {
  Rng rng(o.seed ^ 0x5b117ull);
  for (int64_t i = static_cast<int64_t>(all.size()) - 1; i > 0; --i)
    std::swap(all[i], all[rng.next() % (i + 1)]);
  const auto [a, b] = boundaries(o, static_cast<int64_t>(all.size()));
  out->train.assign(all.begin(), all.begin() + a);
  out->val.assign(all.begin() + a, all.begin() + b);
  out->test.assign(all.begin() + b, all.end());
  for (auto* v : {&out->train, &out->val, &out->test}) std::sort(v->begin(), v->end());
}

}  // namespace seqforge
