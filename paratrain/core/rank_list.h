// Rank lists for one-line messages: the first few ranks, then how many more,
// so that 99999 missing ranks make one short line instead of 589 KB. Pure
// formatting; no LibTorch.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace paratrain::core {

// How many ranks a message names before "... and N more".
inline constexpr std::size_t kNamedRanks = 8;

// `shown`: the first ranks of the list (at most kNamedRanks are printed);
// `total`: how many the whole list holds (>= shown.size()). {1, 3}, 2 ->
// "1,3"; {1, 2, ..., 8}, 99999 -> "1,2,3,4,5,6,7,8 ... and 99991 more".
inline std::string capped_rank_list(const std::vector<int>& shown, std::size_t total) {
  std::string out;
  std::size_t printed = 0;
  for (; printed < shown.size() && printed < kNamedRanks; ++printed) {
    if (printed > 0) out += ',';
    out += std::to_string(shown[printed]);
  }
  if (total > printed) out += " ... and " + std::to_string(total - printed) + " more";
  return out;
}

}  // namespace paratrain::core
