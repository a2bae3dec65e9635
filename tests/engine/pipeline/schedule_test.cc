// The pipeline schedules as programs: for every p <= 8, m <= 32 and v <= 4 each rank's program is
// sound and deadlock free, runs every (micro-batch, chunk) forward and backward exactly once, and
// holds the activations the papers say (1F1B at most p - rank micro-batches, GPipe all m); run
// with uniform stage times, its bubble is the papers' closed form.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/pipeline/schedule.h"

namespace zeroth {
namespace {

TEST(PipeSchedule, EveryScheduleUpTo8StagesIsSoundAndHoldsWhatThePapersSay) {
  int checked = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      for (PipeKind kind : {PipeKind::gpipe, PipeKind::one_f_one_b}) {
        const PipeSchedule s = make_pipe_schedule(kind, p, m);
        ASSERT_EQ(check_schedule(s), "") << pipe_kind_name(kind) << " p " << p << " m " << m;
        // Uniform stages, backward twice forward: the bubble is (p - 1) / (m + p - 1) exactly.
        const PipeTimeline t = simulate_schedule(s, 1.0, 2.0);
        EXPECT_NEAR(t.bubble(), static_cast<double>(p - 1) / (m + p - 1), 1e-12) << pipe_kind_name(kind) << " p " << p << " m " << m;
        EXPECT_DOUBLE_EQ(t.makespan, 3.0 * (m + p - 1));
        for (int r = 0; r < p; ++r) {
          const int most = kind == PipeKind::gpipe ? m : std::min(p - r, m);
          EXPECT_EQ(t.peak_in_flight[static_cast<size_t>(r)], most)
              << pipe_kind_name(kind) << " p " << p << " m " << m << " rank " << r;
        }
        ++checked;
      }
      for (int v = 2; v <= 4; ++v) {
        if (p < 2 || m % p != 0) continue;
        const PipeSchedule s = make_pipe_schedule(PipeKind::interleaved, p, m, v);
        ASSERT_EQ(check_schedule(s), "") << "interleaved p " << p << " m " << m << " v " << v;
        // Each chunk is 1 / v of a stage: the bubble shrinks v-fold, (p - 1) / (v m + p - 1).
        const PipeTimeline t = simulate_schedule(s, 1.0 / v, 2.0 / v);
        EXPECT_NEAR(t.bubble(), pipe_bubble_formula(PipeKind::interleaved, p, m, v), 1e-9)
            << "interleaved p " << p << " m " << m << " v " << v;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 8 * 32 * 2 + 3 * (16 + 10 + 8 + 6 + 5 + 4 + 4));
}

TEST(PipeSchedule, OneFOneBOnFourStagesIsTheTextbookProgram) {
  const PipeSchedule s = make_pipe_schedule(PipeKind::one_f_one_b, 4, 6);
  // Rank 0: three warm-up forwards, then one forward one backward, then three backwards.
  EXPECT_EQ(s.describe(0), "F0 >a0 F1 >a1 F2 >a2 F3 >a3 <g0 B0 F4 >a4 <g1 B1 F5 >a5 <g2 B2 <g3 B3 <g4 B4 <g5 B5");
  // The last stage: no warm-up, no sends of activations, no receives of gradients.
  EXPECT_EQ(s.describe(3), "<a0 F0 B0 >g0 <a1 F1 B1 >g1 <a2 F2 B2 >g2 <a3 F3 B3 >g3 <a4 F4 B4 >g4 <a5 F5 B5 >g5");
}

TEST(PipeSchedule, TheCheckFindsBrokenPrograms) {
  PipeSchedule s = make_pipe_schedule(PipeKind::one_f_one_b, 3, 4);
  // Two receives on rank 1 swapped: the order differs from rank 0's sends.
  PipeSchedule swapped = s;
  auto& r1 = swapped.ranks[1];
  std::swap(r1[0], r1[4]);  // <a0 ... <a1
  EXPECT_NE(check_schedule(swapped), "");
  // A backward dropped.
  PipeSchedule dropped = s;
  for (auto it = dropped.ranks[2].begin(); it != dropped.ranks[2].end(); ++it)
    if (it->op == PipeOp::backward) {
      dropped.ranks[2].erase(it);
      break;
    }
  EXPECT_NE(check_schedule(dropped).find("rank 2 runs 4 forwards and 3 backwards"), std::string::npos) << check_schedule(dropped);
  // Both neighbours receiving before they send: a cycle of waits.
  PipeSchedule cycle = make_pipe_schedule(PipeKind::gpipe, 2, 1);
  // rank 0: F0 >a0 <g0 B0; rank 1: <a0 F0 B0 >g0. Make rank 0 wait for the gradient first.
  auto& r0 = cycle.ranks[0];
  std::rotate(r0.begin(), r0.begin() + 2, r0.end());  // <g0 B0 F0 >a0
  EXPECT_NE(check_schedule(cycle), "");
  EXPECT_THROW(simulate_schedule(cycle), InvalidArgument);
}

TEST(PipeSchedule, RefusesWhatItCannotSchedule) {
  EXPECT_THROW(make_pipe_schedule(PipeKind::interleaved, 4, 6, 2), InvalidArgument);  // m not a multiple of p
  EXPECT_THROW(make_pipe_schedule(PipeKind::interleaved, 4, 8, 1), InvalidArgument);
  EXPECT_THROW(make_pipe_schedule(PipeKind::one_f_one_b, 4, 8, 2), InvalidArgument);
  EXPECT_THROW(make_pipe_schedule(PipeKind::gpipe, 0, 8), InvalidArgument);
  EXPECT_THROW(make_pipe_schedule(PipeKind::gpipe, 2, 0), InvalidArgument);
}

}  // namespace
}  // namespace zeroth
