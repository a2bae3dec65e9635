// Rank arithmetic of the process grid and the three splits.
#include "comm/process_grid.h"

#include "core/error.h"

namespace zeroth {

ProcessGrid::ProcessGrid(int dp, int pp, int tp) : dp_(dp), pp_(pp), tp_(tp) {
  ZEROTH_CHECK(dp >= 1 && pp >= 1 && tp >= 1, "process grid sizes must be at least 1, got dp={} pp={} tp={}", dp, pp, tp);
}

void ProcessGrid::check_rank(int rank) const {
  ZEROTH_CHECK(rank >= 0 && rank < world_size(), "rank {} is outside the process grid {}", rank, describe());
}

GridCoords ProcessGrid::coords(int rank) const {
  check_rank(rank);
  return {(rank / tp_) % dp_, rank / (tp_ * dp_), rank % tp_};
}

int ProcessGrid::rank_of(GridCoords c) const {
  ZEROTH_CHECK(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_,
               "coordinates (dp={}, pp={}, tp={}) are outside the process grid {}", c.dp, c.pp, c.tp, describe());
  return c.pp * dp_ * tp_ + c.dp * tp_ + c.tp;
}

std::vector<int> ProcessGrid::dp_group(int rank) const {
  auto c = coords(rank);
  std::vector<int> group;
  for (c.dp = 0; c.dp < dp_; ++c.dp) group.push_back(rank_of(c));
  return group;
}

std::vector<int> ProcessGrid::tp_group(int rank) const {
  auto c = coords(rank);
  std::vector<int> group;
  for (c.tp = 0; c.tp < tp_; ++c.tp) group.push_back(rank_of(c));
  return group;
}

std::vector<int> ProcessGrid::pp_group(int rank) const {
  auto c = coords(rank);
  std::vector<int> group;
  for (c.pp = 0; c.pp < pp_; ++c.pp) group.push_back(rank_of(c));
  return group;
}

int ProcessGrid::pipeline_prev(int rank) const {
  auto c = coords(rank);
  if (c.pp == 0) return -1;
  --c.pp;
  return rank_of(c);
}

int ProcessGrid::pipeline_next(int rank) const {
  auto c = coords(rank);
  if (c.pp == pp_ - 1) return -1;
  ++c.pp;
  return rank_of(c);
}

std::string ProcessGrid::describe() const { return fmt::format("dp={} x pp={} x tp={} ({} ranks)", dp_, pp_, tp_, world_size()); }

ProcessGrid::Groups ProcessGrid::split(Communicator& world) const {
  ZEROTH_CHECK(world.size() == world_size(), "process grid {} needs {} ranks, the communicator has {}", describe(), world_size(),
               world.size());
  const auto c = coords(world.rank());
  // Color: the coordinates the group shares; key: the coordinate that varies inside it.
  Groups g;
  g.dp = world.split(c.pp * tp_ + c.tp, c.dp);
  g.pp = world.split(c.dp * tp_ + c.tp, c.pp);
  g.tp = world.split(c.pp * dp_ + c.dp, c.tp);
  return g;
}

}  // namespace zeroth
