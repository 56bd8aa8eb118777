// The plan: `grid: auto` picks the smallest grid that fits, a plan that does not fit names
// its need, the budget and the smallest grid, validation's peak counts where it is larger
// than the step's, and the plan's text and JSON carry the same content on every host.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <string>

#include "orchestrator/config.hpp"
#include "orchestrator/conv_geometry.hpp"
#include "orchestrator/memory_model.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/plan.hpp"
#include "orchestrator/plan_report.hpp"
#include "orchestrator/shard_plan.hpp"

#include "common/memory_configs.hpp"

namespace ht {
namespace {

using testing::classifier;
using testing::layer;

// A run that validates needs what its validation does where that is more than the step
// (inference runs batch norm, ReLU and pool apart, beside what the step holds): the plan's
// peak, its verdict, plan_fits and the grid search all take it.
TEST(MemoryModel, ValidationPeakCountsWhereItIsLarger) {
  Config c = classifier();
  // The demo's first block: a 4x4 pool after the fused chain, which is then the step's peak.
  c.model.layers[3] = layer("max_pool2d", {{"pool", int64_t(4)}, {"stride", int64_t(4)}});
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {1, 1});
  const uint64_t step = estimate_memory_max(c, p).total;
  EXPECT_FALSE(make_plan(c, p).busiest.validation);  // no validation: the step's
  c.data.validation = "val.h5";
  const MemoryEstimate val = estimate_validation_memory(c, p, training_schedule(c, p, 0, activation_policies(c, p)));
  ASSERT_GT(val.total, step) << "the test wants a validation above the step";
  const Plan plan = make_plan(c, p);
  EXPECT_TRUE(plan.busiest.validation);
  EXPECT_EQ(plan.busiest.total, val.total);
  EXPECT_EQ(plan.busiest.params, val.params);
  c.parallel.device_memory = (step + val.total) / 2;
  EXPECT_FALSE(plan_fits(c, p));
  const Plan refused = make_plan(c, p);
  EXPECT_NE(refused.verdict.find("in validation"), std::string::npos) << refused.verdict;
  const auto g = smallest_fitting_grid(c, m);
  ASSERT_TRUE(g.has_value());
  EXPECT_GT(g->rows * g->cols, 1);
  EXPECT_TRUE(plan_fits(c, make_shard_plan(m, *g)));
  EXPECT_NE(refused.verdict.find("smallest grid that fits: [" + std::to_string(g->rows) + ", " + std::to_string(g->cols) + "]"),
            std::string::npos)
      << refused.verdict;
}

TEST(MemoryModel, AutoGridPicksTheSmallestThatFits) {
  Config c = classifier();
  const ModelSpec m = build_model_spec(c);
  c.parallel.device_memory = 1ull << 40;
  const GridShape g1 = choose_grid(c, m);
  EXPECT_EQ(g1.rows * g1.cols, 1);

  // For a range of budgets, the chosen grid fits and no grid with fewer shards does.
  const uint64_t whole = estimate_memory_max(c, make_shard_plan(m, {1, 1})).total;
  int distinct = 0, last = 0;
  for (uint64_t budget = whole; budget > whole / 16; budget = budget * 7 / 8) {
    c.parallel.device_memory = budget;
    const auto g = smallest_fitting_grid(c, m);
    if (!g) break;
    const int shards = g->rows * g->cols;
    EXPECT_TRUE(plan_fits(c, make_shard_plan(m, *g)));
    for (int r = 1; r <= 16; ++r)
      for (int cc = 1; r * cc < shards; ++cc) {
        try {
          EXPECT_FALSE(plan_fits(c, make_shard_plan(m, {r, cc}))) << r << "x" << cc << " fits too";
        } catch (const ConfigError&) {
        }
      }
    const GridShape chosen = choose_grid(c, m);
    EXPECT_EQ(chosen.rows, g->rows);
    EXPECT_EQ(chosen.cols, g->cols);
    distinct += shards != last;
    last = shards;
  }
  EXPECT_GE(distinct, 3);

  // Where one shard does not fit (under any policy auto finds) and two do: split along the
  // longer side (fewer halo bytes).
  bool two = false;
  for (uint64_t budget = whole; budget > whole / 16 && !two; budget = budget * 15 / 16) {
    c.parallel.device_memory = budget;
    const auto g = smallest_fitting_grid(c, m);
    if (!g || g->rows * g->cols != 2) continue;
    two = true;
    EXPECT_EQ(g->rows, 2);
    EXPECT_EQ(g->cols, 1);
  }
  EXPECT_TRUE(two);

  // Too small for the weights alone: nothing fits, with a clear message.
  c.parallel.device_memory = 1024;
  EXPECT_FALSE(smallest_fitting_grid(c, m).has_value());
  EXPECT_THROW(choose_grid(c, m), ConfigError);
}

TEST(MemoryModel, FitVerdictNamesNeedBudgetAndSmallestGrid) {
  Config c = classifier();
  c.parallel.activations = ActivationPolicy::Keep;
  const ModelSpec m = build_model_spec(c);
  const ShardPlan one = make_shard_plan(m, {1, 1});
  const uint64_t whole = estimate_memory_max(c, one).total;
  const uint64_t two = estimate_memory_max(c, make_shard_plan(m, {2, 1})).total;
  c.parallel.device_memory = whole;
  EXPECT_EQ(make_plan(c, one).verdict, "");
  EXPECT_TRUE(plan_fits(c, one));

  c.parallel.device_memory = (two + whole) / 2;
  const std::string v = make_plan(c, one).verdict;
  EXPECT_NE(v.find("does not fit"), std::string::npos) << v;
  EXPECT_NE(v.find(format_size(whole)), std::string::npos) << v;
  EXPECT_NE(v.find(format_size(c.parallel.device_memory)), std::string::npos) << v;
  EXPECT_NE(v.find("smallest grid that fits: [2, 1]"), std::string::npos) << v;

  c.parallel.device_memory = 1024;
  EXPECT_NE(make_plan(c, one).verdict.find("no grid fits"), std::string::npos);
}

TEST(PlanReport, TextAndJsonCarryTheSameContent) {
  Config c = classifier();
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {2, 1}, 4);  // two sample groups
  const std::string text = render_plan_text(c, make_plan(c, p));
  EXPECT_NE(text.find("grid [2, 1]"), std::string::npos) << text;
  EXPECT_NE(text.find("conv2d_2"), std::string::npos) << text;
  EXPECT_NE(text.find("FITS"), std::string::npos) << text;
  EXPECT_NE(text.find("[32, 64)"), std::string::npos) << text;  // rank 1's image rows
  EXPECT_NE(text.find("intra-node"), std::string::npos) << text;

  const std::string json = render_plan_json(c, make_plan(c, p));
  size_t ranks = 0;
  for (size_t at = json.find("\"peak_device_bytes\""); at != std::string::npos;
       at = json.find("\"peak_device_bytes\"", at + 1))
    ++ranks;
  EXPECT_EQ(ranks, 4u);
  EXPECT_EQ(std::count(json.begin(), json.end(), '{'), std::count(json.begin(), json.end(), '}'));
  EXPECT_EQ(std::count(json.begin(), json.end(), '['), std::count(json.begin(), json.end(), ']'));
  EXPECT_NE(json.find("\"fits\": true"), std::string::npos);
  EXPECT_NE(json.find("\"rows_above\": 1"), std::string::npos);

  const HaloWidths h = halo_widths(p, 4);  // conv2d_2, 3x3 same
  EXPECT_EQ(h.rows_above, 1);
  EXPECT_EQ(h.rows_below, 1);
  EXPECT_EQ(h.cols_left, 0);

  c.parallel.device_memory = 4096;
  EXPECT_NE(render_plan_text(c, make_plan(c, p)).find("DOES NOT FIT"), std::string::npos);
  EXPECT_NE(render_plan_json(c, make_plan(c, p)).find("\"fits\": false"), std::string::npos);
}

// parallel.threads makes the plan a function of the config: a login node (one CPU for this
// process, OMP_NUM_THREADS=1) and a compute node's rank (13 threads, 4 ranks per node)
// plan the same. With auto they need not: oneDNN's scratchpads follow the threads.
TEST(PlanReport, SetThreadsMakeThePlanTheSameOnEveryHost) {
  Config c = classifier();
  c.model.height = c.model.width = 256;
  const ModelSpec m = build_model_spec(c);
  const ShardPlan p = make_shard_plan(m, {2, 1}, 2);
  auto plan_with = [&](const char* omp, const char* local) {
    const char* kept = std::getenv("OMP_NUM_THREADS");
    const std::string before = kept ? kept : "";
    setenv("OMP_NUM_THREADS", omp, 1);
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);  // an mpirun job of 8 ranks, `local` of them on this node
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", local, 1);
    const std::string json = render_plan_json(c, make_plan(c, p));
    if (kept) setenv("OMP_NUM_THREADS", before.c_str(), 1);
    else unsetenv("OMP_NUM_THREADS");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    return json;
  };
  c.parallel.threads = 3;
  EXPECT_EQ(plan_with("1", "1"), plan_with("13", "4"));
  EXPECT_EQ(threads_per_rank(c, 2), 3);
  // The figure it fixes depends on the threads: were it not a plan input, hosts would differ.
  c.parallel.threads = 1;
  const uint64_t one = conv_scratch_bytes(c, p, 0, ConvUse::Training);
  c.parallel.threads = 16;
  EXPECT_NE(one, conv_scratch_bytes(c, p, 0, ConvUse::Training));
}

}  // namespace
}  // namespace ht
