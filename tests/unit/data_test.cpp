// make-data writes the SPEC section 4 format; DataReader reads tiles that equal the
// corresponding slices of a whole-image read, and rejects bad files with clear messages.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>

#include "orchestrator/config.hpp"
#include "orchestrator/config_io.hpp"
#include "orchestrator/model_spec.hpp"
#include "orchestrator/shard_plan.hpp"
#include "worker/io/data_reader.hpp"
#include "worker/io/h5.hpp"
#include "worker/io/synthetic_data.hpp"
#include "worker/run/batch.hpp"
#include "worker/runtime/backend.hpp"

namespace fs = std::filesystem;
using namespace ht;

namespace {

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("ht_data_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  fs::path dir;
};

SyntheticOptions small(int64_t n, int h, int w, int c) {
  SyntheticOptions o;
  o.count = n;
  o.height = h;
  o.width = w;
  o.channels = c;
  o.classes = 3;
  o.seed = 7;
  return o;
}

DataReaderOptions reader_options(int h, int w, int c, int classes = 3) {
  DataReaderOptions o;
  o.height = h;
  o.width = w;
  o.channels = c;
  o.classes = classes;
  return o;
}

// The whole dataset as float, read independently of DataReader: [N][H][W][C].
std::vector<float> read_all(const std::string& path, const std::string& name) {
  h5::Hid f = h5::open_file(path);
  h5::Hid ds = h5::open_dataset(f, name);
  std::vector<float> v(size_t(h5::element_count(h5::dataset_shape(ds))));
  h5::read_dataset(ds, v.data(), int64_t(v.size()));
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST_F(DataTest, MakeDataWritesTheFormat) {
  const std::string path = file("d.h5");
  write_synthetic_dataset(path, small(5, 70, 300, 2));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);  // no temp
  h5::Hid f = h5::open_file(path);
  h5::Hid images = h5::open_dataset(f, "images");
  EXPECT_EQ(h5::dataset_shape(images), (h5::Shape{5, 70, 300, 2}));
  EXPECT_EQ(h5::chunk_shape(images), (h5::Shape{1, 70, 256, 2}));
  h5::Hid type = h5::type_id(H5Dget_type(images));
  EXPECT_EQ(h5::type_name(type), "float32");
  h5::Hid labels = h5::open_dataset(f, "labels");
  EXPECT_EQ(h5::dataset_shape(labels), (h5::Shape{5}));
  EXPECT_EQ(h5::type_name(h5::type_id(H5Dget_type(labels))), "int32");
  std::vector<int64_t> l(5);
  h5::read_dataset(labels, l.data(), 5);
  for (int64_t v : l) EXPECT_TRUE(v >= 0 && v < 3) << v;
  EXPECT_FALSE(h5::exists(f, "masks"));
  for (float v : read_all(path, "images")) ASSERT_TRUE(v >= 0.f && v <= 1.f) << v;
}

TEST_F(DataTest, MakeDataIsDeterministic) {
  write_synthetic_dataset(file("a.h5"), small(3, 40, 30, 1));
  write_synthetic_dataset(file("b.h5"), small(3, 40, 30, 1));
  SyntheticOptions other = small(3, 40, 30, 1);
  other.seed = 8;
  write_synthetic_dataset(file("c.h5"), other);
  EXPECT_EQ(read_all(file("a.h5"), "images"), read_all(file("b.h5"), "images"));
  EXPECT_EQ(read_all(file("a.h5"), "labels"), read_all(file("b.h5"), "labels"));
  EXPECT_NE(read_all(file("a.h5"), "images"), read_all(file("c.h5"), "images"));
}

// The label shows in the mean brightness: class k has k+1 blobs.
TEST_F(DataTest, LabelsAreLearnableFromBrightness) {
  SyntheticOptions o = small(60, 48, 48, 1);
  write_synthetic_dataset(file("d.h5"), o);
  auto images = read_all(file("d.h5"), "images");
  auto labels = read_all(file("d.h5"), "labels");
  std::vector<double> sum(3, 0.0), n(3, 0.0);
  const size_t plane = 48 * 48;
  for (size_t i = 0; i < 60; ++i) {
    double m = std::accumulate(images.begin() + long(i * plane), images.begin() + long((i + 1) * plane), 0.0) / plane;
    sum[size_t(labels[i])] += m;
    n[size_t(labels[i])] += 1;
  }
  for (int k = 0; k < 3; ++k) EXPECT_EQ(n[size_t(k)], 20);  // balanced
  EXPECT_LT(sum[0] / n[0], sum[1] / n[1]);
  EXPECT_LT(sum[1] / n[1], sum[2] / n[2]);
}

TEST_F(DataTest, MasksMarkTheBlobs) {
  SyntheticOptions o = small(4, 300, 90, 1);
  o.targets = TargetKind::Masks;
  write_synthetic_dataset(file("m.h5"), o);
  h5::Hid f = h5::open_file(file("m.h5"));
  h5::Hid masks = h5::open_dataset(f, "masks");
  EXPECT_EQ(h5::dataset_shape(masks), (h5::Shape{4, 300, 90, 1}));
  EXPECT_EQ(h5::chunk_shape(masks), (h5::Shape{1, 256, 90, 1}));
  EXPECT_EQ(h5::type_name(h5::type_id(H5Dget_type(masks))), "uint8");
  EXPECT_FALSE(h5::exists(f, "labels"));
  auto m = read_all(file("m.h5"), "masks");
  auto img = read_all(file("m.h5"), "images");
  double on = 0, off = 0, n_on = 0, n_off = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    ASSERT_TRUE(m[i] == 0.f || m[i] == 1.f);
    (m[i] == 1.f ? on : off) += img[i];
    (m[i] == 1.f ? n_on : n_off) += 1;
  }
  ASSERT_GT(n_on, 0);
  ASSERT_GT(n_off, 0);
  EXPECT_GT(on / n_on, off / n_off + 0.3);
}

// Tiles (including ones crossing chunk borders and touching the image edges) equal the
// same slice of a whole read, in [C][rows][cols] order.
TEST_F(DataTest, TilesEqualSlicesOfTheWholeImage) {
  const int N = 2, H = 300, W = 270, C = 3;
  write_synthetic_dataset(file("d.h5"), small(N, H, W, C));
  auto all = read_all(file("d.h5"), "images");
  DataReader r(file("d.h5"), reader_options(H, W, C));
  EXPECT_EQ(r.count(), N);
  EXPECT_FALSE(r.has_masks());
  EXPECT_EQ(r.pixel_type(), PixelType::Float32);
  const std::vector<Rect> rects = {{{0, H}, {0, W}}, {{250, 300}, {200, 270}}, {{7, 9}, {255, 258}}, {{0, 1}, {0, 1}}};
  for (int64_t n = 0; n < N; ++n)
    for (const Rect& rect : rects) {
      std::vector<float> tile(size_t(rect.area() * C));
      r.read_image_tile(n, rect, 2.f, tile.data());
      for (int c = 0; c < C; ++c)
        for (int y = rect.rows.lo; y < rect.rows.hi; ++y)
          for (int x = rect.cols.lo; x < rect.cols.hi; ++x) {
            float want = 2.f * all[((size_t(n) * H + y) * W + x) * C + c];
            float got = tile[(size_t(c) * rect.rows.size() + (y - rect.rows.lo)) * rect.cols.size() + (x - rect.cols.lo)];
            ASSERT_EQ(got, want) << "n " << n << " c " << c << " y " << y << " x " << x;
          }
    }
  std::vector<float> tile(16);
  EXPECT_THROW(r.read_image_tile(N, {{0, 1}, {0, 1}}, 1.f, tile.data()), std::out_of_range);
  EXPECT_THROW(r.read_image_tile(0, {{H - 1, H + 1}, {0, 1}}, 1.f, tile.data()), std::out_of_range);
  auto labels = read_all(file("d.h5"), "labels");
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(r.read_label(n), int32_t(labels[size_t(n)]));
}

TEST_F(DataTest, IntegerPixelsConvertAndScale) {
  for (PixelType t : {PixelType::UInt16, PixelType::UInt8}) {
    SyntheticOptions o = small(2, 40, 50, 1);
    o.dtype = t;
    const std::string path = file(std::string("d_") + to_string(t) + ".h5");
    write_synthetic_dataset(path, o);
    h5::Hid f = h5::open_file(path);
    h5::Hid ds = h5::open_dataset(f, "images");
    EXPECT_EQ(h5::type_name(h5::type_id(H5Dget_type(ds))), to_string(t));
    std::vector<float> raw(2 * 40 * 50);
    h5::read_dataset(ds, raw.data(), int64_t(raw.size()));
    const float scale = t == PixelType::UInt16 ? 1.f / 65535 : 1.f / 255;
    DataReader r(path, reader_options(40, 50, 1));
    EXPECT_EQ(r.pixel_type(), t);
    Rect rect{{10, 30}, {5, 45}};
    std::vector<float> tile(size_t(rect.area()));
    r.read_image_tile(1, rect, scale, tile.data());
    float hi = 0;
    for (int y = rect.rows.lo; y < rect.rows.hi; ++y)
      for (int x = rect.cols.lo; x < rect.cols.hi; ++x) {
        float got = tile[size_t(y - rect.rows.lo) * rect.cols.size() + (x - rect.cols.lo)];
        ASSERT_EQ(got, raw[(40 + size_t(y)) * 50 + x] * scale);
        ASSERT_TRUE(got >= 0.f && got <= 1.f);
        hi = std::max(hi, got);
      }
    EXPECT_GT(hi, 0.3f);  // the raw values really are 0..65535 / 0..255, scaled down
  }
}

TEST_F(DataTest, MaskTilesAndLabelsExpectations) {
  SyntheticOptions o = small(2, 64, 40, 1);
  o.targets = TargetKind::Masks;
  write_synthetic_dataset(file("m.h5"), o);
  DataReaderOptions opt = reader_options(64, 40, 1, 0);
  opt.targets = "masks";
  DataReader r(file("m.h5"), opt);
  EXPECT_TRUE(r.has_masks());
  auto all = read_all(file("m.h5"), "masks");
  Rect rect{{3, 60}, {1, 39}};
  std::vector<float> tile(size_t(rect.area()));
  r.read_mask_tile(1, rect, tile.data());
  for (int y = rect.rows.lo; y < rect.rows.hi; ++y)
    for (int x = rect.cols.lo; x < rect.cols.hi; ++x)
      ASSERT_EQ(tile[size_t(y - 3) * 38 + (x - 1)], all[(64 + size_t(y)) * 40 + x]);
  // The loss needs labels but the file holds masks.
  opt.expect = TargetKind::Labels;
  std::string msg = error_of([&] { DataReader(file("m.h5"), opt); });
  EXPECT_NE(msg.find("'masks' is [2, 64, 40, 1] (masks) but model.loss needs labels [2]"), std::string::npos) << msg;
}

// Class maps for a per-pixel softmax (SPEC section 7): [N, H, W] or [N, H, W, 1], ids in
// [0, K), read like masks; an id outside, or a fraction, names the image, row and col.
TEST_F(DataTest, ClassMapsForAPerPixelSoftmax) {
  const std::string path = file("c.h5");
  write_synthetic_dataset(path, small(2, 6, 4, 1));
  std::vector<float> maps(2 * 6 * 4);
  for (size_t i = 0; i < maps.size(); ++i) maps[i] = float(i % 3);
  maps[24 + 2 * 4 + 3] = 3;  // image 1, row 2, col 3: not a class of 3
  {
    h5::Hid f = h5::open_file(path, H5F_ACC_RDWR);
    h5::write_dataset(f, "maps", {2, 6, 4}, maps.data());
  }
  DataReaderOptions opt = reader_options(6, 4, 1, 3);
  opt.targets = "maps";
  opt.expect = TargetKind::Masks;
  DataReader r(path, opt);
  EXPECT_TRUE(r.has_masks());
  std::vector<float> tile(24);
  r.read_mask_tile(0, Rect{{0, 6}, {0, 4}}, tile.data());
  EXPECT_EQ(tile, std::vector<float>(maps.begin(), maps.begin() + 24));
  const std::string msg = error_of([&] { r.read_mask_tile(1, Rect{{0, 6}, {0, 4}}, tile.data()); });
  EXPECT_NE(msg.find("dataset 'maps' image 1 has 3 at row 2, col 3: class maps must hold class ids in [0, 3) for "
                     "the 3-channel softmax output"),
            std::string::npos)
      << msg;
  // Averaging class ids makes no class: downsampling is refused for more than two.
  opt.downsample = 2;
  opt.height = 3;
  opt.width = 2;
  const std::string down = error_of([&] { DataReader(path, opt); });
  EXPECT_NE(down.find("class maps of 3 classes cannot be averaged"), std::string::npos) << down;
}

TEST_F(DataTest, LabelValuesAreCheckedOnRead) {
  const std::string path = file("l.h5");
  write_synthetic_dataset(path, small(3, 8, 8, 1));
  {
    h5::Hid f = h5::open_file(path, H5F_ACC_RDWR);
    H5Ldelete(f, "labels", H5P_DEFAULT);
    std::vector<int32_t> labels = {0, 5, 1};
    h5::write_dataset(f, "labels", {3}, labels.data());
  }
  DataReader r(path, reader_options(8, 8, 1, 2));
  EXPECT_EQ(r.read_label(0), 0);
  EXPECT_EQ(r.read_label(2), 1);
  std::string msg = error_of([&] { r.read_label(1); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'labels'[1] = 5 is not a class id in [0, 2)"), std::string::npos) << msg;
}

TEST_F(DataTest, ErrorsNameFileDatasetExpectedAndFound) {
  std::string msg = error_of([&] { DataReader(file("missing.h5"), reader_options(8, 8, 1)); });
  EXPECT_NE(msg.find(file("missing.h5")), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  std::ofstream(file("text.h5")) << "hello";
  msg = error_of([&] { DataReader(file("text.h5"), reader_options(8, 8, 1)); });
  EXPECT_NE(msg.find("not an HDF5 file"), std::string::npos) << msg;

  write_synthetic_dataset(file("x.h5"), small(16, 97, 83, 1));
  msg = error_of([&] { DataReader(file("x.h5"), reader_options(96, 83, 1)); });
  EXPECT_NE(msg.find(file("x.h5") + ": dataset 'images' is [16, 97, 83, 1] but model.input is [96, 83, 1]"),
            std::string::npos) << msg;

  DataReaderOptions opt = reader_options(97, 83, 1);
  opt.targets = "targets";
  msg = error_of([&] { DataReader(file("x.h5"), opt); });
  EXPECT_NE(msg.find("no dataset 'targets' (data.targets); the file holds: images, labels"), std::string::npos) << msg;

  {  // int16 pixels are not a supported image dtype
    h5::Hid f = h5::create_file(file("i16.h5"));
    h5::Hid ds = h5::create_dataset(f, "images", H5T_STD_I16LE, {2, 4, 4, 1});
    std::vector<int32_t> labels = {0, 1};
    h5::write_dataset(f, "labels", {2}, labels.data());
  }
  msg = error_of([&] { DataReader(file("i16.h5"), reader_options(4, 4, 1)); });
  EXPECT_NE(msg.find("dataset 'images' has dtype int16, expected float32, uint8 or uint16"), std::string::npos) << msg;

  {  // float labels
    h5::Hid f = h5::create_file(file("fl.h5"));
    h5::Hid ds = h5::create_dataset(f, "images", H5T_IEEE_F32LE, {2, 4, 4, 1});
    std::vector<float> labels = {0, 1};
    h5::write_dataset(f, "labels", {2}, labels.data());
  }
  msg = error_of([&] { DataReader(file("fl.h5"), reader_options(4, 4, 1)); });
  EXPECT_NE(msg.find("dataset 'labels' has dtype float32, expected integer class ids"), std::string::npos) << msg;

  SyntheticOptions bad = small(0, 8, 8, 1);
  msg = error_of([&] { write_synthetic_dataset(file("bad.h5"), bad); });
  EXPECT_NE(msg.find("--count must be >= 1"), std::string::npos) << msg;
}

long peak_rss_kib() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// The seed case's image size: written one chunk row at a time, so the peak memory stays
// far below one float image (5928 x 4728 x 4 bytes = 107 MiB); tiles read back.
TEST_F(DataTest, FullSizeImageIsWrittenInBands) {
  SyntheticOptions o = small(1, 5928, 4728, 1);
  o.dtype = PixelType::UInt8;
  const long before = peak_rss_kib();
  write_synthetic_dataset(file("big.h5"), o);
  EXPECT_LT(peak_rss_kib() - before, 48 * 1024) << "KiB of extra peak memory";
  DataReader r(file("big.h5"), reader_options(5928, 4728, 1));
  Rect rect{{2960, 2970}, {4700, 4728}};
  std::vector<float> tile(size_t(rect.area()), -1.f);
  r.read_image_tile(0, rect, 1.f, tile.data());
  for (float v : tile) ASSERT_TRUE(v >= 0.f && v <= 255.f);
}

}  // namespace

namespace {

// A batch's tensors and targets, to compare two loads.
struct Loaded {
  std::vector<float> images, targets;
  std::vector<int32_t> labels;
  std::vector<int64_t> samples;
  int64_t position = 0;
};
Loaded copy_of(const Batch& b) {
  Loaded l;
  l.images.assign(b.images.data(), b.images.data() + b.images.size());
  l.targets.assign(b.targets.data(), b.targets.data() + b.targets.size());
  l.labels = b.labels;
  l.samples = b.samples;
  l.position = b.batch_position;
  return l;
}
void expect_same(const Loaded& a, const Loaded& b, const std::string& where) {
  EXPECT_EQ(a.images, b.images) << where;
  EXPECT_EQ(a.targets, b.targets) << where;
  EXPECT_EQ(a.labels, b.labels) << where;
  EXPECT_EQ(a.samples, b.samples) << where;
  EXPECT_EQ(a.position, b.position) << where;
}

}  // namespace

// The next micro-batch is read on a background thread into tensors allocated (and counted)
// when it is asked for: what it yields is what reading at once yields, micro-batch by
// micro-batch, across epochs, after a jump (a resume) and after a rebind (a recycle).
TEST_F(DataTest, BatchesReadInTheBackgroundEqualThoseReadAtOnce) {
  write_synthetic_dataset(file("d.h5"), small(7, 20, 12, 1));
  const Config c = parse_config("name: t\nrun_dir: " + file("run") + "\nseed: 5\n"
                                "data: {train: " + file("d.h5") + ", shuffle: true, "
                                "augment: {flip: [horizontal]}}\n"
                                "model:\n  input: [20, 12, 1]\n  layers:\n"
                                "    - {type: conv2d, filters: 2, kernel: 3, padding: same}\n"
                                "    - {type: global_avg_pool}\n    - {type: dense, units: 3}\n"
                                "  loss: softmax_cross_entropy\n"
                                "training: {batch_size: 4, accumulate: 2, steps: 9}\n"
                                "parallel: {backend: cpu, grid: [2, 1]}\n",
                                "t.yaml");
  const ModelSpec m = build_model_spec(c);
  const ShardPlan plan = make_shard_plan(m, {2, 1});
  BackendOptions o;
  std::unique_ptr<ComputeBackend> backend = make_backend(o);
  BatchSource ahead(c, plan, 1, *backend), at_once(c, plan, 1, *backend);
  Allocator& a = backend->allocator();
  uint64_t one_batch = 0;
  for (int64_t step = 0; step < 6; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      const uint64_t before = a.in_use();
      const Batch got = ahead.load(step, micro, micro == 1 ? step + 1 : step, 1 - micro);
      const uint64_t bytes = got.images.bytes() + got.targets.bytes();
      // Held now: this micro-batch and the next one being read (from step 0's second on,
      // `before` already holds the one just taken).
      EXPECT_EQ(a.in_use(), (step == 0 && micro == 0 ? before + 2 * bytes : before + bytes))
          << "step " << step << " micro " << micro;
      one_batch = bytes;
      expect_same(copy_of(got), copy_of(at_once.load(step, micro)), "step " + std::to_string(step));
    }
  }
  // A jump drops the read under way and reads at once.
  expect_same(copy_of(ahead.load(8, 1, 9, 0)), copy_of(at_once.load(8, 1)), "after a jump");
  const uint64_t held = a.in_use();
  ahead.rebind(backend.get());  // a recycle: the read under way is dropped and freed
  EXPECT_EQ(a.in_use(), held - one_batch);
  expect_same(copy_of(ahead.load(9, 0)), copy_of(at_once.load(9, 0)), "after a rebind");
}
