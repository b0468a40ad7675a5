// The group of the listed ranks of `g`, in the listed order, built on Group::split; nullptr on
// ranks not listed. Called by every member of `g` with the same list.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "ranks/group.h"

namespace deepinfer::ranks {

inline std::unique_ptr<Group> subgroup(Group& g, std::span<const int> ranks) {
  std::vector<bool> seen(size_t(g.size()), false);
  int my_index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    DI_REQUIRE(r >= 0 && r < g.size(), "subgroup: rank ", r, " is outside the group of ", g.size());
    DI_REQUIRE(!seen[size_t(r)], "subgroup: rank ", r, " is listed twice");
    seen[size_t(r)] = true;
    if (r == g.rank()) my_index = int(i);
  }
  DI_REQUIRE(!ranks.empty(), "subgroup: the rank list is empty");
  return g.split(my_index >= 0 ? 0 : -1, my_index);
}

}  // namespace deepinfer::ranks
