// SPEC section 8's pure parts: the new config keys and their errors, the learning-rate
// schedules, auc, and the data reader's views (crops read only their tile's rows,
// downsampling is a box average, flips mirror), each against a hand computation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/config_support.hpp"
#include "orchestrator/config.hpp"
#include "orchestrator/config_io.hpp"
#include "orchestrator/model_spec.hpp"
#include "worker/io/data_reader.hpp"
#include "worker/io/h5.hpp"
#include "worker/run/batch.hpp"
#include "worker/run/evaluation.hpp"
#include "worker/run/run_report.hpp"

namespace fs = std::filesystem;

namespace ht {
namespace {

using namespace ht::testing;

const char* kClassifier = R"(data:
  train: d.h5
model:
  input: [32, 24, 1]
  layers:
    - {type: conv2d, filters: 4}
    - {type: global_avg_pool}
    - {type: dense, units: 3}
training:
  steps: 10
)";

TEST(Section8Config, DefaultsAndEveryKey) {
  const Config d = parse_config(kMinimal, "cfg.yaml");
  EXPECT_TRUE(d.data.validation.empty());
  EXPECT_EQ(d.data.downsample, 1);
  EXPECT_FALSE(d.data.augment.crops());
  EXPECT_EQ(d.training.validate_every, 0);
  ASSERT_EQ(d.training.metrics.size(), 1u);
  EXPECT_EQ(d.training.metrics[0], Metric::Accuracy);
  EXPECT_EQ(d.training.lr_schedule.type, ScheduleType::Constant);
  EXPECT_EQ(d.training.weight_decay, 0.0);
  EXPECT_EQ(d.training.accumulate, 1);

  const Config c = parse_config(
      std::string(kMinimal) +
          "  batch_size: 4\n  validate_every: 5\n  metrics: [dice, iou]\n  weight_decay: 0.01\n  accumulate: 2\n"
          "  lr_schedule: {type: cosine, warmup_steps: 3, min_lr: 0.00001}\n",
      "cfg.yaml",
      {"data.validation=v.h5", "data.downsample=2", "data.augment={flip: [vertical], crop: [32, 24]}"});
  EXPECT_EQ(c.data.validation, "v.h5");
  EXPECT_EQ(c.data.downsample, 2);
  EXPECT_TRUE(c.data.augment.flip_vertical);
  EXPECT_FALSE(c.data.augment.flip_horizontal);
  EXPECT_EQ(c.data.augment.crop_height, 32);
  EXPECT_EQ(c.training.validate_every, 5);
  EXPECT_EQ(c.training.metrics, (std::vector<Metric>{Metric::Dice, Metric::IoU}));
  EXPECT_EQ(c.training.lr_schedule.type, ScheduleType::Cosine);
  EXPECT_EQ(c.training.lr_schedule.warmup_steps, 3);
  EXPECT_DOUBLE_EQ(c.training.lr_schedule.min_lr, 1e-5);
  EXPECT_EQ(c.training.accumulate, 2);
  // Emitted and read back, every key survives.
  const Config again = parse_config(to_yaml(c), "emitted.yaml");
  EXPECT_EQ(to_yaml(again), to_yaml(c));
}

TEST(Section8Config, Errors) {
  EXPECT_CONTAINS(error_of(kMinimal, {"training.metrics=[acuracy]"}), "did you mean 'accuracy'?");
  EXPECT_CONTAINS(error_of(kMinimal, {"training.metrics=[dice, dice]"}), "dice is listed twice");
  EXPECT_CONTAINS(error_of(kMinimal, {"training.batch_size=6", "training.accumulate=4"}),
                  "4 micro-batches must divide training.batch_size 6");
  EXPECT_CONTAINS(error_of(kMinimal, {"data.augment={crop: [16, 24]}"}),
                  "data.augment.crop: the window [16, 24] must equal model.input's [32, 24]");
  EXPECT_CONTAINS(error_of(kMinimal, {"data.augment={flip: [diagonal]}"}), "expected one of");
  EXPECT_CONTAINS(error_of(kMinimal, {"training.lr_schedule={type: step, warmup_steps: 2}"}),
                  "is not allowed with type step (it is a setting of cosine)");
  EXPECT_CONTAINS(error_of(kMinimal, {"training.weight_decay=-1"}), "expected a number >= 0");
  EXPECT_CONTAINS(error_of(kMinimal, {"data.downsample=0"}), "data.downsample");
}

TEST(Section8Config, MetricsMustSuitTheOutput) {
  auto spec_error = [](const std::string& yaml, const std::vector<std::string>& sets) {
    try {
      build_model_spec(parse_config(yaml, "cfg.yaml", sets));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_CONTAINS(spec_error(kClassifier, {"training.metrics=[auc]"}),
                  "auc needs two classes (dense units 1 or 2); the model's output has 3 classes");
  EXPECT_CONTAINS(spec_error(kClassifier, {"training.metrics=[dice]"}), "dice is for masks");
  EXPECT_EQ(spec_error(kClassifier, {"training.metrics=[auc]", "model.layers[2].units=2"}), "no error");
  const std::string masks = "data: {train: d.h5, targets: masks}\nmodel:\n  input: [8, 8, 1]\n  layers:\n"
                            "    - {type: conv2d, filters: 1, kernel: 3, padding: same}\n  loss: sigmoid_bce\n"
                            "training: {steps: 1}\n";
  EXPECT_CONTAINS(spec_error(masks, {"training.metrics=[auc]"}), "auc is for label outputs");
  EXPECT_EQ(spec_error(masks, {"training.metrics=[dice, iou, accuracy]"}), "no error");
}

TEST(Section8Schedule, AsTheFormulas) {
  const double lr = 0.1;
  LrSchedule s;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, lr, 7, 10), 0.1);
  s.type = ScheduleType::Step;
  s.every = 3;
  s.factor = 0.5;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, lr, 2, 10), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, lr, 3, 10), 0.05);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, lr, 9, 10), 0.0125);
  s.type = ScheduleType::Cosine;
  s.warmup_steps = 4;
  s.min_lr = 0.02;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, lr, 0, 12), 0.025);  // lr * 1/4
  EXPECT_DOUBLE_EQ(scheduled_lr(s, lr, 3, 12), 0.1);    // lr * 4/4
  EXPECT_DOUBLE_EQ(scheduled_lr(s, lr, 4, 12), 0.1);    // the cosine starts at lr
  EXPECT_NEAR(scheduled_lr(s, lr, 8, 12), 0.06, 1e-15);  // half way: (lr + min_lr) / 2
  EXPECT_NEAR(scheduled_lr(s, lr, 12, 12), 0.02, 1e-15);
}

TEST(Section8Auc, MannWhitneyWithTies) {
  // Pairs (positive, negative): 3 x 2 = 6; wins: 0.9 > both, 0.4 > 0.1 and ties 0.4 (1/2),
  // 0.1 ties 0.1 (1/2) and loses to 0.4: 2 + 1.5 + 0.5 = 4 of 6.
  EXPECT_DOUBLE_EQ(roc_auc({0.9, 0.4, 0.1, 0.4, 0.1}, {1, 1, 1, 0, 0}), 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(roc_auc({0.2, 0.8}, {0, 1}), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc({0.2, 0.8}, {1, 0}), 0.0);
  EXPECT_TRUE(std::isnan(roc_auc({0.2, 0.8}, {1, 1})));
}

class ViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("ht_view_" + std::to_string(getpid()));
    fs::create_directories(dir);
    path = (dir / "v.h5").string();
    // 2 images of H x W x 2, pixel (n, y, x, c) = 1000 n + 10 y + x + 0.5 c; masks y > x.
    std::vector<float> px(size_t(2) * H * W * 2);
    std::vector<float> mask(size_t(2) * H * W);
    for (int n = 0; n < 2; ++n)
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) {
          for (int c = 0; c < 2; ++c) px[((size_t(n) * H + y) * W + x) * 2 + c] = 1000.f * n + 10.f * y + x + 0.5f * c;
          mask[(size_t(n) * H + y) * W + x] = y > x ? 1.f : 0.f;
        }
    h5::Hid f = h5::create_file(path);
    h5::Hid images = h5::create_dataset(f, "images", H5T_IEEE_F32LE, {2, H, W, 2}, {1, 4, W, 2});
    h5::write_hyperslab(images, {0, 0, 0, 0}, {2, H, W, 2}, H5T_NATIVE_FLOAT, px.data());
    h5::Hid masks = h5::create_dataset(f, "masks", H5T_IEEE_F32LE, {2, H, W, 1}, {1, 4, W, 1});
    h5::write_hyperslab(masks, {0, 0, 0, 0}, {2, H, W, 1}, H5T_NATIVE_FLOAT, mask.data());
  }
  void TearDown() override { fs::remove_all(dir); }
  DataReaderOptions options(int h, int w, int f, bool crop) const {
    DataReaderOptions o;
    o.height = h;
    o.width = w;
    o.channels = 2;
    o.targets = "masks";
    o.downsample = f;
    o.larger_ok = crop;
    return o;
  }
  static float pixel(int n, int y, int x, int c) { return 1000.f * n + 10.f * y + x + 0.5f * c; }
  static constexpr int H = 40, W = 30;
  fs::path dir;
  std::string path;
};

TEST_F(ViewTest, CropReadsOnlyItsTileAndFlipsMirror) {
  DataReader r(path, options(16, 12, 1, true));
  EXPECT_EQ(r.view_height(), H);
  SampleView v;
  v.top = 9;
  v.left = 5;
  v.flip_rows = true;
  v.flip_cols = true;
  const Rect tile{{4, 8}, {0, 6}};  // rows 4..7, cols 0..5 of the 16 x 12 window
  std::vector<float> out(size_t(2) * 4 * 6);
  r.read_image_tile(1, tile, 1.f, out.data(), v);
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) {
        // Mirrored in the window: view row y is window row 15 - y, col x is 11 - x.
        const int y = v.top + 15 - (tile.rows.lo + i), x = v.left + 11 - (tile.cols.lo + j);
        EXPECT_EQ(out[(size_t(c) * 4 + i) * 6 + j], pixel(1, y, x, c)) << c << " " << i << " " << j;
      }
  // The reader read the tile's block and nothing more: 4 x 6 pixels x 2 channels.
  EXPECT_EQ(r.bytes_read(), uint64_t(4 * 6 * 2 * sizeof(float)));
  std::vector<float> m(4 * 6);
  r.read_mask_tile(1, tile, m.data(), v);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) {
      const int y = v.top + 15 - (tile.rows.lo + i), x = v.left + 11 - (tile.cols.lo + j);
      EXPECT_EQ(m[size_t(i) * 6 + j], y > x ? 1.f : 0.f);
    }
}

TEST_F(ViewTest, DownsampleIsABoxAverage) {
  DataReader r(path, options(H / 2, W / 2, 2, false));
  const Rect tile{{3, 7}, {2, 9}};
  std::vector<float> out(size_t(2) * 4 * 7);
  r.read_image_tile(0, tile, 2.f, out.data());
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 7; ++j) {
        const int y = 2 * (tile.rows.lo + i), x = 2 * (tile.cols.lo + j);
        const float mean = (pixel(0, y, x, c) + pixel(0, y + 1, x, c) + pixel(0, y, x + 1, c) + pixel(0, y + 1, x + 1, c)) / 4;
        EXPECT_FLOAT_EQ(out[(size_t(c) * 4 + i) * 7 + j], 2.f * mean);
      }
  EXPECT_EQ(r.bytes_read(), uint64_t(8 * 14 * 2 * sizeof(float)));  // the tile's 2 x 2 boxes
}

TEST_F(ViewTest, SizesThatDoNotFitAreNamed) {
  auto error = [&](const DataReaderOptions& o) {
    try {
      DataReader r(path, o);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_CONTAINS(error(options(16, 12, 3, false)), "data.downsample 3 does not divide the 40x30 images");
  EXPECT_CONTAINS(error(options(48, 12, 1, true)), "data.augment.crop [48, 12] is larger than the 40x30 images");
  EXPECT_CONTAINS(error(options(24, 12, 2, true)), "larger than the 20x15 images (after data.downsample 2)");
  EXPECT_CONTAINS(error(options(16, 12, 2, false)), "20x15 (after data.downsample 2), but model.input is [16, 12, 2]");
}

TEST(Section8Augment, DrawsDependOnSeedStepAndImageOnly) {
  Config c = parse_config(kMinimal, "cfg.yaml", {"data.augment={flip: [horizontal, vertical], crop: [32, 24]}"});
  int flips = 0, distinct = 0;
  SampleView last;
  for (int64_t step = 0; step < 64; ++step) {
    const SampleView a = augment_view(c, step, 5, 100, 90), b = augment_view(c, step, 5, 100, 90);
    EXPECT_EQ(a.top, b.top);
    EXPECT_EQ(a.flip_rows, b.flip_rows);
    EXPECT_GE(a.top, 0);
    EXPECT_LE(a.top, 100 - 32);
    EXPECT_LE(a.left, 90 - 24);
    flips += a.flip_cols;
    distinct += a.top != last.top;
    last = a;
  }
  EXPECT_GT(flips, 16);  // about half of 64
  EXPECT_LT(flips, 48);
  EXPECT_GT(distinct, 48);
  Config other = c;
  other.seed += 1;
  int differ = 0;
  for (int64_t step = 0; step < 64; ++step) differ += augment_view(c, step, 5, 100, 90).top != augment_view(other, step, 5, 100, 90).top;
  EXPECT_GT(differ, 48);
}

}  // namespace
}  // namespace ht

namespace ht {
namespace {

// A resume under other validation settings: every old value stays under the column of its
// name; columns not logged before are empty; ones no longer asked for are dropped.
TEST(Section8Metrics, ResumeKeepsValuesUnderTheirColumnNames) {
  const fs::path dir = fs::temp_directory_path() / ("ht_metrics_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "metrics.csv");
    out << "step,epoch,loss,lr,seconds,images_per_s,peak_device_bytes,val_loss,val_accuracy\n"
        << "1,0,0.9,0.1,1,2,3,0.8,0.5\n"
        << "2,0,0.7,0.1,1,2,3,,\n"
        << "3,0,0.6,0.1,1,2,3,0.6,0.75\n";
  }
  Config c = parse_config(kClassifier, "cfg.yaml",
                          {"run_dir=" + dir.string(), "data.validation=v.h5", "training.metrics=[auc, accuracy]",
                           "model.layers[2].units=2"});
  const ShardPlan plan = make_shard_plan(build_model_spec(c), {1, 1});
  prepare_run_files(c, plan, 2, 10);
  std::ifstream in(dir / "metrics.csv");
  std::string header, row1, row2, more;
  std::getline(in, header);
  std::getline(in, row1);
  std::getline(in, row2);
  EXPECT_EQ(header, "step,epoch,loss,lr,seconds,images_per_s,peak_device_bytes,val_loss,val_auc,val_accuracy");
  EXPECT_EQ(row1, "1,0,0.9,0.1,1,2,3,0.8,,0.5");
  EXPECT_EQ(row2, "2,0,0.7,0.1,1,2,3,,,");
  EXPECT_FALSE(std::getline(in, more));  // step 3 is past the resume point
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ht
