#pragma once
// The stage families behind make_strategy (internal to zero/).
#include <memory>

#include "ds/zero/strategy.h"

namespace ds::zero::detail {

// Stages 0-2 (flat_strategy.cpp).
std::unique_ptr<Strategy> make_flat_strategy(nn::Module& model, std::shared_ptr<comm::Group> group,
                                             const Options& options);
// Stage 3 (stage3.cpp).
std::unique_ptr<Strategy> make_stage3_strategy(nn::Module& model,
                                               std::shared_ptr<comm::Group> group,
                                               const Options& options);

}  // namespace ds::zero::detail
