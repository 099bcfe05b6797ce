#pragma once
// Muon (optim/muon.h) over a ZeRO strategy: which tensors get Muon (optim::muon_uses on each
// flat entry's name and shape) and which piece of each this rank's optimizer range holds (from
// held_ranges(): one contiguous range at stages 0-2, one shard per parameter at stage 3), plus
// the exchange the cut matrices need (a float sum over the data-parallel group).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ds/optim/muon.h"
#include "ds/zero/strategy.h"

namespace ds::zero {

// One MuonTensor per flat entry, in flat order (the same list on every rank, pieces apart).
std::vector<optim::MuonTensor> muon_tensors(const Strategy& z);

// Sets the tensors and, on more than one rank, the exchange over z.group(); `log` gets one line
// (Muon and AdamW element counts, state MiB against AdamW's).
void attach_muon(optim::Muon& opt, const Strategy& z,
                 const std::function<void(const std::string&)>& log);

}  // namespace ds::zero
