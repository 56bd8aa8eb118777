// Halo exchange over the local (threads) comm: index test and adjoint test, square and
// non-square windows (tests/common/halo_checks.hpp), on grids
// 1x1, 1x4, 4x1, 2x2, 3x2 with uneven sizes.
#include <gtest/gtest.h>

#include <thread>

#include "common/halo_checks.hpp"
#include "worker/comm/local_comm.hpp"

namespace ht {
namespace {

struct GridCase {
  int rows, cols, h, w;
};

class HaloExchangeTest : public ::testing::TestWithParam<GridCase> {};

// Runs `body(rank, comm, backend)` on every rank of the grid's plan as threads.
template <class Body>
void on_every_rank(const ShardPlan& plan, Body body) {
  auto comms = LocalComm::create(plan.world());
  std::vector<std::thread> threads;
  std::vector<std::string> errors(plan.world());
  for (int r = 0; r < plan.world(); ++r)
    threads.emplace_back([&, r] {
      try {
        auto backend = make_backend({});
        body(r, *comms[r], *backend);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        comms[r]->abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < plan.world(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST_P(HaloExchangeTest, EveryExtendedCellHoldsItsGlobalIndex) {
  const GridCase g = GetParam();
  const ShardPlan plan = make_shard_plan(testing::halo_model(g.h, g.w), {g.rows, g.cols});
  std::vector<std::string> failures(plan.world());
  on_every_rank(plan, [&](int rank, Comm& comm, ComputeBackend& backend) {
    for (int l = 0; l < int(plan.model.layers.size()) && failures[rank].empty(); ++l)
      failures[rank] = testing::check_gather_indices(plan, l, rank, comm, backend);
  });
  for (const auto& f : failures) EXPECT_EQ(f, "");
}

TEST_P(HaloExchangeTest, BackwardIsTheAdjointOfForward) {
  const GridCase g = GetParam();
  const ShardPlan plan = make_shard_plan(testing::halo_model(g.h, g.w), {g.rows, g.cols});
  std::vector<double> gaps(plan.world(), 0.0);
  on_every_rank(plan, [&](int rank, Comm& comm, ComputeBackend& backend) {
    for (int l = 0; l < int(plan.model.layers.size()); ++l)
      gaps[rank] = std::max(gaps[rank], testing::adjoint_gap(plan, l, rank, comm, backend));
  });
  for (double gap : gaps) EXPECT_LT(gap, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Grids, HaloExchangeTest,
                         ::testing::Values(GridCase{1, 1, 37, 29}, GridCase{1, 4, 41, 67}, GridCase{4, 1, 67, 41},
                                           GridCase{2, 2, 53, 47}, GridCase{3, 2, 71, 45}),
                         [](const auto& info) {
                           return fmt::format("grid{}x{}_{}x{}", info.param.rows, info.param.cols,
                                              info.param.h, info.param.w);
                         });

}  // namespace
}  // namespace ht
