#pragma once
// Classification scores of an evaluation (the Accelerate guide's MRPC experiment reports accuracy
// and F1): accuracy, and F1 as GLUE does it.
//
//   num_labels == 2: binary F1 of label 1 (sklearn f1_score(y, pred), MRPC's / QQP's "f1")
//   num_labels  > 2: macro F1, the unweighted mean of each label's F1 (f1_score(average="macro"))
// A label's F1 is 2 TP / (2 TP + FP + FN), 0 when that is 0 / 0 (never predicted and never true:
// sklearn's zero_division=0). Pure functions; thread-safe.
#include <cstdint>
#include <span>
#include <string>

namespace ds::train {

struct ClassifyScores {
  int64_t examples = 0;
  double accuracy = 0.0;                         // correct / examples
  double f1 = 0.0;                               // binary F1 of label 1, or macro F1 (above)
  const char* f1_kind = "binary F1 of label 1";  // or "macro F1"
};

// predictions[i] and labels[i] in [0, num_labels); the spans have the same length (>= 1). Throws
// ds::Error otherwise.
ClassifyScores classify_scores(std::span<const int32_t> predictions,
                               std::span<const int32_t> labels, int64_t num_labels);

}  // namespace ds::train
