// The report's inputs and its page: metrics.csv and memory.csv are read strictly (a file cut
// mid-line, a missing column, a field that is no number: one message naming file and line),
// run.json round-trips, and the page carries its data as one JSON block nothing can end early.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <functional>
#include <string>

#include "orchestrator/config.hpp"
#include "orchestrator/layer_kind.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/shard_plan.hpp"
#include "report/report.hpp"

namespace ht {
namespace {

const char* kHeader = "step,epoch,loss,lr,seconds,images_per_s,peak_device_bytes\n";

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(Report, MetricsRowsAndEmptyCells) {
  const MetricsTable t = parse_metrics_csv(
      std::string("step,loss,val_loss\n") + "1,0.7,\n" + "2,0.6,0.65\n", "runs/x/metrics.csv");
  ASSERT_EQ(t.columns.size(), 3u);
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_DOUBLE_EQ(*t.rows[1][1], 0.6);
  EXPECT_FALSE(t.rows[0][2].has_value());
  EXPECT_DOUBLE_EQ(*t.rows[1][2], 0.65);
}

TEST(Report, MetricsFileCutMidLineIsRefused) {
  const std::string cut = std::string(kHeader) + "1,0,0.69,0.003,0.2,20,123\n2,0,0.6";
  const std::string m = message_of([&] { parse_metrics_csv(cut, "runs/x/metrics.csv"); });
  EXPECT_NE(m.find("runs/x/metrics.csv"), std::string::npos) << m;
  EXPECT_NE(m.find("line 3"), std::string::npos) << m;
  EXPECT_NE(m.find("mid-line"), std::string::npos) << m;
}

TEST(Report, MetricsErrorsNameTheLineAndColumn) {
  std::string m = message_of([] { parse_metrics_csv("step,epoch\n1,0\n", "m.csv"); });
  EXPECT_NE(m.find("no column 'loss'"), std::string::npos) << m;
  m = message_of([] { parse_metrics_csv("step,loss\n1,0.5\n2,abc\n", "m.csv"); });
  EXPECT_NE(m.find("line 3, column 'loss': 'abc' is not a number"), std::string::npos) << m;
  m = message_of([] { parse_metrics_csv("step,loss\n1,0.5,9\n", "m.csv"); });
  EXPECT_NE(m.find("line 2 has 3 fields; the header has 2"), std::string::npos) << m;
  m = message_of([] { parse_metrics_csv("", "m.csv"); });
  EXPECT_NE(m.find("empty"), std::string::npos) << m;
}

TEST(Report, MemoryRowsPerRank) {
  const std::vector<RankMemory> v = parse_memory_csv(
      "rank,peak_device_bytes,predicted_peak_device_bytes,host_pool_peak_bytes,predicted_host_pool_bytes\n"
      "0,100,101,0,0\n1,200,202,5,6\n",
      "memory.csv");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[1].rank, 1);
  EXPECT_EQ(v[1].peak_device, 200u);
  EXPECT_EQ(v[1].predicted_device, 202u);
  EXPECT_EQ(v[1].predicted_host_pool, 6u);
  const std::string m = message_of([] { parse_memory_csv("rank,peak_device_bytes\n0,1\n", "memory.csv"); });
  EXPECT_NE(m.find("no column 'predicted_peak_device_bytes'"), std::string::npos) << m;
}

TEST(Report, RunInfoRoundTripsAndNamesWhatIsWrong) {
  const RunInfo in{"name: x\n", "cfg.yaml", "/work/here", {2, 3}, 12, 40};
  const RunInfo out = parse_run_info(run_info_json(in), "run.json");
  EXPECT_EQ(out.config_text, in.config_text);
  EXPECT_EQ(out.config_path, "cfg.yaml");
  EXPECT_EQ(out.working_directory, "/work/here");
  EXPECT_EQ(out.grid.rows, 2);
  EXPECT_EQ(out.grid.cols, 3);
  EXPECT_EQ(out.world, 12);
  EXPECT_EQ(out.total_steps, 40);
  std::string m = message_of([] { parse_run_info("{\"format\": 1", "r/run.json"); });
  EXPECT_NE(m.find("r/run.json: not valid JSON"), std::string::npos) << m;
  m = message_of([] { parse_run_info("{\"config_path\": \"a\", \"config_text\": \"b\"}", "r/run.json"); });
  EXPECT_NE(m.find("no key 'grid'"), std::string::npos) << m;
  m = message_of([] {
    parse_run_info("{\"config_path\": \"a\", \"config_text\": \"b\", \"grid\": [2, 2], \"world\": 3, "
                   "\"total_steps\": 1}",
                   "r/run.json");
  });
  EXPECT_NE(m.find("is not a plan"), std::string::npos) << m;
}

// A config whose name holds markup: the title is escaped, and the data block holds no '<'
// at all, so neither "</script>" nor "<!--" in any string can end it.
TEST(Report, PageEscapesTheTitleAndKeepsTheDataInOneBlock) {
  Config c;
  c.name = "</script><b>x";
  c.model.height = 16;
  c.model.width = 12;
  c.model.channels = 1;
  const LayerConfig conv = make_layer_config(
      "conv2d", {{"filters", int64_t(2)}, {"kernel", int64_t(3)}, {"padding", Padding{PaddingMode::Same, 0}}});
  const LayerConfig pool = make_layer_config("global_avg_pool");
  const LayerConfig dense = make_layer_config("dense", {{"units", int64_t(2)}});
  c.model.layers = {conv, pool, dense};
  const ShardPlan plan = make_shard_plan(build_model_spec(c), {2, 1});
  RunRecord run;
  run.metrics = parse_metrics_csv("step,loss\n1,0.5\n", "m.csv");
  Thumbnail none;
  none.missing = "data/x.h5 does not exist";
  const std::string page = render_report_html(c, make_plan(c, plan), &run, none);
  EXPECT_NE(page.find("<title>halotrain report: &lt;/script&gt;&lt;b&gt;x</title>"), std::string::npos);
  const std::string open = "<script type=\"application/json\" id=\"halotrain-data\">";
  const size_t begin = page.find(open) + open.size();
  const size_t end = page.find("</script>", begin);
  ASSERT_NE(end, std::string::npos);
  const std::string block = page.substr(begin, end - begin);
  EXPECT_EQ(block.find('<'), std::string::npos);
  const nlohmann::json doc = nlohmann::json::parse(block);
  EXPECT_EQ(doc["name"], c.name);
  EXPECT_EQ(doc["kind"], "run");
  EXPECT_EQ(doc["plan"]["shard_map"]["tiles"].size(), 2u);
  EXPECT_EQ(doc["plan"]["shard_map"]["layers"].size(), 1u);  // the conv: the one windowed layer
  EXPECT_EQ(doc["image"]["missing"], "data/x.h5 does not exist");
  EXPECT_EQ(doc["run"]["columns"]["loss"][0], 0.5);

  // A Latin-1 name (not UTF-8) still makes a page; the byte becomes U+FFFD.
  c.name = "d\xe9mo";
  const std::string latin1 = render_report_html(c, make_plan(c, plan), &run, none);
  EXPECT_NE(latin1.find("d\xef\xbf\xbdmo"), std::string::npos);
  c.name = "plain";

  const std::string plan_page = render_report_html(c, make_plan(c, plan), nullptr, none);
  const nlohmann::json plan_doc = nlohmann::json::parse(
      plan_page.substr(plan_page.find(open) + open.size(),
                       plan_page.find("</script>", plan_page.find(open)) - plan_page.find(open) - open.size()));
  EXPECT_EQ(plan_doc["kind"], "plan");
  EXPECT_FALSE(plan_doc.contains("run"));
}

}  // namespace
}  // namespace ht
