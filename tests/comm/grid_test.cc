// ProcessGrid layouts against Megatron's enumeration, and the groups split from a real
// communicator (local ranks as threads) containing exactly those ranks.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "comm/local/local_comm.h"
#include "comm/process_grid.h"
#include "comm/rendezvous.h"
#include "core/device.h"
#include "core/error_types.h"

namespace zeroth {
namespace {

struct Layout {
  int dp, pp, tp;
};
void PrintTo(const Layout& l, std::ostream* os) { *os << "dp " << l.dp << " x pp " << l.pp << " x tp " << l.tp; }

// Megatron-LM's initialize_model_parallel enumeration, written out independently.
std::set<std::vector<int>> megatron_tp_groups(int world, int tp) {
  std::set<std::vector<int>> groups;
  for (int i = 0; i < world / tp; ++i) {
    std::vector<int> g;
    for (int j = 0; j < tp; ++j) g.push_back(i * tp + j);
    groups.insert(g);
  }
  return groups;
}
std::set<std::vector<int>> megatron_pp_groups(int world, int pp) {
  std::set<std::vector<int>> groups;
  const int stride = world / pp;
  for (int i = 0; i < stride; ++i) {
    std::vector<int> g;
    for (int j = i; j < world; j += stride) g.push_back(j);
    groups.insert(g);
  }
  return groups;
}
std::set<std::vector<int>> megatron_dp_groups(int world, int pp, int tp) {
  std::set<std::vector<int>> groups;
  const int per_stage = world / pp;
  for (int s = 0; s < pp; ++s) {
    for (int j = 0; j < tp; ++j) {
      std::vector<int> g;
      for (int k = s * per_stage + j; k < (s + 1) * per_stage; k += tp) g.push_back(k);
      groups.insert(g);
    }
  }
  return groups;
}

class Grid : public ::testing::TestWithParam<Layout> {};

TEST_P(Grid, GroupsMatchMegatronsLayout) {
  const auto [dp, pp, tp] = GetParam();
  ProcessGrid grid(dp, pp, tp);
  const int world = grid.world_size();
  std::set<std::vector<int>> dps, pps, tps;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(grid.rank_of(grid.coords(r)), r);
    dps.insert(grid.dp_group(r));
    pps.insert(grid.pp_group(r));
    tps.insert(grid.tp_group(r));
    const auto c = grid.coords(r);
    EXPECT_EQ(grid.pipeline_prev(r), c.pp == 0 ? -1 : grid.pp_group(r)[c.pp - 1]);
    EXPECT_EQ(grid.pipeline_next(r), c.pp == pp - 1 ? -1 : grid.pp_group(r)[c.pp + 1]);
  }
  EXPECT_EQ(tps, megatron_tp_groups(world, tp));
  EXPECT_EQ(pps, megatron_pp_groups(world, pp));
  EXPECT_EQ(dps, megatron_dp_groups(world, pp, tp));
}

// Each rank's split groups hold exactly the grid's ranks, in order: an all_gather of world
// ranks inside each group returns its member list.
TEST_P(Grid, SplitCommunicatorsHoldTheGridsRanks) {
  const auto [dp, pp, tp] = GetParam();
  ProcessGrid grid(dp, pp, tp);
  auto device = make_device("cpu");
  run_local_ranks(grid.world_size(), [&](Communicator& world) {
    auto stream = device->create_stream();
    auto groups = grid.split(world);
    auto members = [&](Communicator& group) {
      Buffer buf = device->allocate(4 * group.size(), MemTag::buffers);
      const float me = static_cast<float>(world.rank());
      device->copy(*stream, buf.as<float>() + group.rank(), &me, 4);
      group.all_gather(*stream, {buf.as<float>() + group.rank(), 1, DType::f32}, buf.view(DType::f32));
      std::vector<float> got(group.size());
      device->copy(*stream, got.data(), buf.data(), 4 * group.size());
      stream->synchronize();
      return std::vector<int>(got.begin(), got.end());
    };
    EXPECT_EQ(members(*groups.dp), grid.dp_group(world.rank()));
    EXPECT_EQ(members(*groups.pp), grid.pp_group(world.rank()));
    EXPECT_EQ(members(*groups.tp), grid.tp_group(world.rank()));
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, Grid, ::testing::Values(Layout{2, 2, 2}, Layout{1, 2, 4}, Layout{4, 1, 2}, Layout{8, 1, 1}),
                         [](const auto& info) {
  return "dp" + std::to_string(info.param.dp) + "_pp" + std::to_string(info.param.pp) + "_tp" + std::to_string(info.param.tp);
});

TEST(GridErrors, BadSizesAndRanksAreRejected) {
  EXPECT_THROW(ProcessGrid(0, 1, 1), InvalidArgument);
  ProcessGrid grid(2, 1, 2);
  EXPECT_THROW(grid.coords(4), InvalidArgument);
  EXPECT_THROW(grid.rank_of({2, 0, 0}), InvalidArgument);
}

// The launcher environments all land in the same RendezvousInfo.
TEST(Rendezvous, TorchrunSlurmAndOpenMpiVariablesAreRead) {
  const char* all_vars[] = {"RANK",
                            "WORLD_SIZE",
                            "LOCAL_RANK",
                            "LOCAL_WORLD_SIZE",
                            "MASTER_ADDR",
                            "MASTER_PORT",
                            "SLURM_PROCID",
                            "SLURM_NTASKS",
                            "SLURM_LOCALID",
                            "SLURM_NNODES",
                            "SLURM_JOB_NODELIST",
                            "SLURM_NTASKS_PER_NODE",
                            "OMPI_COMM_WORLD_RANK",
                            "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK",
                            "OMPI_COMM_WORLD_LOCAL_SIZE"};
  auto clear = [&] {
    for (auto* v : all_vars) unsetenv(v);
  };
  clear();
  EXPECT_FALSE(rendezvous_from_env().has_value());

  setenv("RANK", "3", 1), setenv("WORLD_SIZE", "8", 1), setenv("LOCAL_RANK", "1", 1), setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "node7", 1), setenv("MASTER_PORT", "1234", 1);
  auto t = rendezvous_from_env();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, "torchrun");
  EXPECT_EQ(t->rank, 3);
  EXPECT_EQ(t->world_size, 8);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->master_addr, "node7");
  EXPECT_EQ(t->master_port, 1234);
  setenv("RANK", "8", 1);
  EXPECT_THROW(rendezvous_from_env(), ConfigError);
  setenv("RANK", "x", 1);
  EXPECT_THROW(rendezvous_from_env(), ConfigError);
  clear();

  setenv("SLURM_PROCID", "5", 1), setenv("SLURM_NTASKS", "16", 1), setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NNODES", "4", 1), setenv("SLURM_JOB_NODELIST", "gpu[07-10],cpu1", 1);
  auto s = rendezvous_from_env();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->source, "slurm");
  EXPECT_EQ(s->rank, 5);
  EXPECT_EQ(s->world_size, 16);
  EXPECT_EQ(s->local_world_size, 4);
  EXPECT_EQ(s->master_addr, "gpu07");
  clear();

  setenv("OMPI_COMM_WORLD_RANK", "2", 1), setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1), setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  auto o = rendezvous_from_env();
  ASSERT_TRUE(o);
  EXPECT_EQ(o->source, "openmpi");
  EXPECT_EQ(o->master_addr, "127.0.0.1");
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  EXPECT_THROW(rendezvous_from_env(), ConfigError) << "several hosts without MASTER_ADDR";
  clear();
  EXPECT_EQ(first_slurm_host("a1,b2"), "a1");
  EXPECT_EQ(first_slurm_host("n[3,5-6]"), "n3");
}

}  // namespace
}  // namespace zeroth
