#include "ds/train/classify_metrics.h"

#include <vector>

#include "ds/core/error.h"

namespace ds::train {

ClassifyScores classify_scores(std::span<const int32_t> pred, std::span<const int32_t> labels,
                               int64_t num_labels) {
  DS_CHECK(pred.size() == labels.size() && !pred.empty() && num_labels >= 2,
           "[metrics] {} predictions for {} labels over {} classes", pred.size(), labels.size(),
           num_labels);
  const size_t NL = static_cast<size_t>(num_labels);
  std::vector<int64_t> tp(NL, 0), fp(NL, 0), fn(NL, 0);
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    const int32_t p = pred[i], y = labels[i];
    DS_CHECK(p >= 0 && p < num_labels && y >= 0 && y < num_labels,
             "[metrics] prediction {} / label {} outside [0, {})", p, y, num_labels);
    if (p == y) {
      ++correct;
      ++tp[static_cast<size_t>(p)];
    } else {
      ++fp[static_cast<size_t>(p)];
      ++fn[static_cast<size_t>(y)];
    }
  }
  auto f1_of = [&](size_t c) {
    const int64_t den = 2 * tp[c] + fp[c] + fn[c];
    return den == 0 ? 0.0 : 2.0 * static_cast<double>(tp[c]) / static_cast<double>(den);
  };
  ClassifyScores s;
  s.examples = static_cast<int64_t>(pred.size());
  s.accuracy = static_cast<double>(correct) / static_cast<double>(pred.size());
  if (NL == 2) {
    s.f1 = f1_of(1);
  } else {
    double sum = 0.0;
    for (size_t c = 0; c < NL; ++c) sum += f1_of(c);
    s.f1 = sum / static_cast<double>(NL);
    s.f1_kind = "macro F1";
  }
  return s;
}

}  // namespace ds::train
