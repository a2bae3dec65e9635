// ProcessGrid(dp, pp, tp): Megatron's rank layout for 3D parallelism. Tensor-parallel ranks are
// adjacent (fastest), then data-parallel, then pipeline stages:
//   rank = pp_index * (dp * tp) + dp_index * tp + tp_index
#pragma once

#include <memory>  // std::unique_ptr
#include <string>  // std::string
#include <vector>  // std::vector

#include "comm/communicator.h"

namespace zeroth {

struct GridCoords {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const GridCoords&) const = default;
};

class ProcessGrid {
 public:
  // InvalidArgument unless every size is >= 1.
  ProcessGrid(int dp, int pp, int tp);

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int world_size() const { return dp_ * pp_ * tp_; }

  GridCoords coords(int rank) const;
  int rank_of(GridCoords c) const;
  // World ranks of `rank`'s groups, in group-rank order.
  std::vector<int> dp_group(int rank) const;
  std::vector<int> tp_group(int rank) const;
  std::vector<int> pp_group(int rank) const;
  // Neighbouring pipeline stages (same dp and tp index), or -1 at the ends.
  int pipeline_prev(int rank) const;
  int pipeline_next(int rank) const;
  std::string describe() const;  // "dp=2 x pp=2 x tp=2 (8 ranks)"

  // This rank's three groups, split from a communicator of world_size() ranks (collective).
  struct Groups {
    std::unique_ptr<Communicator> dp, pp, tp;
  };
  Groups split(Communicator& world) const;

 private:
  void check_rank(int rank) const;
  int dp_, pp_, tp_;
};

}  // namespace zeroth
