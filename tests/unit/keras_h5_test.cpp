// Keras 2 weights files: our checkpoints round-trip, are checksummed and written
// atomically, and interoperate with files written/read the way Keras 2.1.6 does
// (tests/python/keras_compat.py re-enacts Keras with h5py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "orchestrator/config.hpp"
#include "worker/io/h5.hpp"
#include "worker/io/keras_h5.hpp"

namespace fs = std::filesystem;
using namespace ht;

namespace {

// The formula tests/python/keras_compat.py uses for every weight.
std::vector<float> value(int layer_index, int weight_index, const std::vector<int64_t>& shape) {
  std::vector<float> v(size_t(h5::element_count(shape)));
  float seed = float(10 * layer_index + weight_index + 1);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.01f + seed;
  return v;
}

struct ModelLayer {
  std::string name;
  std::vector<std::pair<std::string, std::vector<int64_t>>> weights;
};

// Same model as keras_compat.py's MODEL.
const std::vector<ModelLayer> kModel = {
    {"conv2d_1", {{"kernel:0", {3, 3, 1, 4}}, {"bias:0", {4}}}},
    {"batch_normalization_1", {{"gamma:0", {4}}, {"beta:0", {4}}, {"moving_mean:0", {4}}, {"moving_variance:0", {4}}}},
    {"activation_1", {}},
    {"max_pooling2d_1", {}},
    {"global_average_pooling2d_1", {}},
    {"dense_1", {{"kernel:0", {4, 2}}, {"bias:0", {2}}}},
};

// Owns the value buffers behind the KerasLayerWeights pointers.
struct Checkpoint {
  std::vector<std::vector<float>> buffers;
  std::vector<KerasLayerWeights> layers;
  HalotrainState state;
  Checkpoint() {
    buffers.reserve(64);
    for (size_t li = 0; li < kModel.size(); ++li) {
      KerasLayerWeights l;
      l.layer = kModel[li].name;
      for (size_t wi = 0; wi < kModel[li].weights.size(); ++wi) {
        buffers.push_back(value(int(li), int(wi), kModel[li].weights[wi].second));
        l.weight_names.push_back(kModel[li].weights[wi].first);
        l.shapes.push_back(kModel[li].weights[wi].second);
        l.data.push_back(buffers.back().data());
      }
      layers.push_back(l);
    }
    state.step = 7;
    state.epoch = 1;
    state.cursor = 3;
    state.rng_state = std::string("mt\0state\x01\x02", 10);  // binary-safe
    state.config_text = "name: demo\nseed: 1234\n";
    state.model_hash = "0123abcd";
    const std::vector<std::pair<std::string, std::vector<int64_t>>> slots = {
        {"adam/m/conv2d_1/kernel:0", {3, 3, 1, 4}}, {"adam/v/dense_1/bias:0", {2}}};
    for (size_t si = 0; si < slots.size(); ++si) {
      buffers.push_back(value(90 + int(si), 0, slots[si].second));
      state.slots.push_back({slots[si].first, slots[si].second, buffers.back().data()});
    }
  }
};

bool have_python_h5py() {
  static const bool ok =
      std::system("/usr/bin/python3 -c 'import h5py, numpy' >/dev/null 2>&1") == 0;
  return ok;
}

int run_python(const std::string& args) {
  std::string cmd = std::string("/usr/bin/python3 ") + HALOTRAIN_SOURCE_DIR +
                    "/tests/python/keras_compat.py " + args;
  return std::system(cmd.c_str());
}

class KerasH5 : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("ht_keras_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    return names;
  }
  // Checks every weight of kModel in `f` against the shared formula.
  static void expect_model(const KerasWeightsFile& f) {
    ASSERT_EQ(f.layer_names().size(), kModel.size());
    for (size_t li = 0; li < kModel.size(); ++li) {
      const auto& layer = kModel[li];
      EXPECT_EQ(f.layer_names()[li], layer.name);
      ASSERT_EQ(f.weight_names(layer.name).size(), layer.weights.size());
      for (size_t wi = 0; wi < layer.weights.size(); ++wi) {
        EXPECT_EQ(f.weight_names(layer.name)[wi], layer.name + "/" + layer.weights[wi].first);
        EXPECT_EQ(f.shape(layer.name, layer.weights[wi].first), layer.weights[wi].second);
        std::vector<float> got(size_t(h5::element_count(layer.weights[wi].second)), -1.f);
        f.read(layer.name, layer.weights[wi].first, got.data());
        EXPECT_EQ(got, value(int(li), int(wi), layer.weights[wi].second)) << layer.name;
      }
    }
  }
  fs::path dir;
};

TEST_F(KerasH5, WriteReadRoundTrip) {
  Checkpoint ck;
  const std::string path = file("ckpt-7.h5");
  write_checkpoint(path, ck.layers, ck.state);
  EXPECT_EQ(listing(), std::vector<std::string>{"ckpt-7.h5"});  // no temp file left

  KerasWeightsFile f(path);
  EXPECT_FALSE(f.is_model_file());
  EXPECT_EQ(f.keras_version(), "2.1.6");
  EXPECT_EQ(f.backend(), "tensorflow");
  expect_model(f);
  // The full stored name works as well as the short one.
  EXPECT_EQ(f.shape("conv2d_1", "conv2d_1/kernel:0"), (std::vector<int64_t>{3, 3, 1, 4}));

  ASSERT_TRUE(f.has_halotrain());
  HalotrainState s = f.read_state();
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.epoch, 1);
  EXPECT_EQ(s.cursor, 3);
  EXPECT_EQ(s.rng_state, ck.state.rng_state);
  EXPECT_EQ(s.config_text, ck.state.config_text);
  EXPECT_EQ(s.model_hash, "0123abcd");
  EXPECT_EQ(s.format_version, kCheckpointFormatVersion);
  ASSERT_EQ(s.slots.size(), 2u);
  for (size_t i = 0; i < s.slots.size(); ++i) {
    EXPECT_EQ(s.slots[i].name, ck.state.slots[i].name);
    EXPECT_EQ(s.slots[i].shape, ck.state.slots[i].shape);
    EXPECT_EQ(f.slot_shape(s.slots[i].name), ck.state.slots[i].shape);
    std::vector<float> got(size_t(h5::element_count(s.slots[i].shape)));
    f.read_slot(s.slots[i].name, got.data());
    EXPECT_EQ(got, value(90 + int(i), 0, s.slots[i].shape));
  }
  EXPECT_EQ(f.stored_checksum().rfind("sha256:", 0), 0u);
  EXPECT_TRUE(f.verify_checksum());

  std::ostringstream out;
  EXPECT_EQ(inspect_file(path, out), 0);
  EXPECT_NE(out.str().find("step: 7"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("checksum: OK"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("[3, 3, 1, 4]"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("activation_1  (no weights)"), std::string::npos) << out.str();
}

TEST_F(KerasH5, UnknownLayerOrWeightNamesFileLayerAndWeight) {
  Checkpoint ck;
  const std::string path = file("c.h5");
  write_checkpoint(path, ck.layers, ck.state);
  KerasWeightsFile f(path);
  std::vector<float> buf(64);
  try {
    f.read("conv2d_9", "kernel:0", buf.data());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("no layer 'conv2d_9'"), std::string::npos) << e.what();
  }
  try {
    f.shape("dense_1", "gamma:0");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'dense_1' has no weight 'gamma:0'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(KerasWeightsFile(file("missing.h5")), ConfigError);
  std::ofstream(file("text.h5")) << "not hdf5";
  try {
    KerasWeightsFile bad(file("text.h5"));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is not an HDF5 file"), std::string::npos) << e.what();
  }
}

// Flips one byte of a weight's stored data: the checksum must notice.
TEST_F(KerasH5, ChecksumDetectsFlippedByte) {
  Checkpoint ck;
  const std::string path = file("c.h5");
  write_checkpoint(path, ck.layers, ck.state);
  haddr_t offset;
  {
    h5::Hid f = h5::open_file(path);
    h5::Hid ds = h5::open_dataset(f, "dense_1/dense_1/kernel:0");
    offset = H5Dget_offset(ds);
    ASSERT_NE(offset, HADDR_UNDEF);
  }
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(std::streamoff(offset + 5));
    char c = 0;
    io.read(&c, 1);
    c ^= 0x10;
    io.seekp(std::streamoff(offset + 5));
    io.write(&c, 1);
  }
  KerasWeightsFile f(path);
  EXPECT_FALSE(f.verify_checksum());
  std::ostringstream out;
  EXPECT_EQ(inspect_file(path, out), 1);
  EXPECT_NE(out.str().find("checksum: FAILED"), std::string::npos) << out.str();
}

TEST_F(KerasH5, ChecksumCoversTheState) {
  Checkpoint ck;
  const std::string path = file("c.h5");
  write_checkpoint(path, ck.layers, ck.state);
  {
    h5::Hid f = h5::open_file(path, H5F_ACC_RDWR);
    h5::Hid g = h5::open_group(f, "halotrain");
    h5::write_attr_int64(g, "step", 8);
  }
  EXPECT_FALSE(KerasWeightsFile(path).verify_checksum());
}

TEST_F(KerasH5, FailedWriteLeavesNoTempAndKeepsTheOldFile) {
  Checkpoint ck;
  const std::string path = file("c.h5");
  write_checkpoint(path, ck.layers, ck.state);
  // "a" as a dataset and "a/b" under it: HDF5 fails half-way through the write.
  std::vector<float> x(4, 1.f);
  HalotrainState bad = ck.state;
  bad.step = 99;
  bad.slots = {{"a", {4}, x.data()}, {"a/b", {4}, x.data()}};
  try {
    write_checkpoint(path, ck.layers, bad);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"c.h5"});
  KerasWeightsFile f(path);
  EXPECT_EQ(f.read_state().step, 7);
  EXPECT_TRUE(f.verify_checksum());
  // Inconsistent arguments are refused before anything is written.
  auto layers = ck.layers;
  layers[0].data.pop_back();
  EXPECT_THROW(write_checkpoint(file("d.h5"), layers, ck.state), std::invalid_argument);
  EXPECT_THROW(write_checkpoint(file("nodir/e.h5"), ck.layers, ck.state), std::runtime_error);
  EXPECT_EQ(listing(), std::vector<std::string>{"c.h5"});
}

// Our writer splits layer_names over 64 KiB like Keras, and reads the parts back.
TEST_F(KerasH5, LongLayerListSplitsIntoParts) {
  std::vector<KerasLayerWeights> layers(3000);
  for (size_t i = 0; i < layers.size(); ++i) layers[i].layer = "a_long_layer_name_number_" + std::to_string(100000 + i);
  const std::string path = file("big.h5");
  write_checkpoint(path, layers, HalotrainState{});
  {
    h5::Hid f = h5::open_file(path);
    EXPECT_FALSE(h5::has_attr(f, "layer_names"));
    EXPECT_TRUE(h5::has_attr(f, "layer_names0"));
    EXPECT_TRUE(h5::has_attr(f, "layer_names1"));
  }
  KerasWeightsFile f(path);
  ASSERT_EQ(f.layer_names().size(), layers.size());
  EXPECT_EQ(f.layer_names().back(), layers.back().layer);
  EXPECT_TRUE(f.verify_checksum());
}

TEST_F(KerasH5, ReadsKerasSaveWeightsFile) {
  if (!have_python_h5py()) GTEST_SKIP() << "/usr/bin/python3 lacks h5py";
  const std::string path = file("keras.h5");
  ASSERT_EQ(run_python("save-weights " + path), 0);
  KerasWeightsFile f(path);
  EXPECT_FALSE(f.is_model_file());
  EXPECT_EQ(f.keras_version(), "2.1.6");
  expect_model(f);
  EXPECT_FALSE(f.has_halotrain());
  std::ostringstream out;
  EXPECT_EQ(inspect_file(path, out), 0);
  EXPECT_NE(out.str().find("halotrain: none"), std::string::npos) << out.str();
  EXPECT_THROW(f.read_state(), ConfigError);
}

TEST_F(KerasH5, ReadsKerasModelSaveFile) {
  if (!have_python_h5py()) GTEST_SKIP() << "/usr/bin/python3 lacks h5py";
  const std::string path = file("model.h5");
  ASSERT_EQ(run_python("model-save " + path), 0);
  KerasWeightsFile f(path);
  EXPECT_TRUE(f.is_model_file());
  expect_model(f);
}

TEST_F(KerasH5, ReadsVariableLengthStringAttributes) {
  if (!have_python_h5py()) GTEST_SKIP() << "/usr/bin/python3 lacks h5py";
  const std::string path = file("vlen.h5");
  ASSERT_EQ(run_python("vlen " + path), 0);
  KerasWeightsFile f(path);
  EXPECT_EQ(f.backend(), "tensorflow");
  expect_model(f);
}

TEST_F(KerasH5, ReadsKerasSplitLayerNames) {
  if (!have_python_h5py()) GTEST_SKIP() << "/usr/bin/python3 lacks h5py";
  const std::string path = file("split.h5");
  ASSERT_EQ(run_python("split " + path), 0);
  KerasWeightsFile f(path);
  ASSERT_EQ(f.layer_names().size(), 2001u);
  EXPECT_EQ(f.layer_names()[1999], "layer_with_a_rather_long_name_0000001999");
  EXPECT_EQ(f.layer_names()[2000], "dense_1");
  EXPECT_TRUE(f.weight_names("layer_with_a_rather_long_name_0000000000").empty());
  std::vector<float> bias(2);
  f.read("dense_1", "bias:0", bias.data());
  EXPECT_EQ(bias, value(2000, 1, {2}));
}

// Keras's load_weights (re-enacted) reads our checkpoint, and Python's hashlib agrees with
// our checksum.
TEST_F(KerasH5, KerasLoaderReadsOurCheckpoint) {
  if (!have_python_h5py()) GTEST_SKIP() << "/usr/bin/python3 lacks h5py";
  Checkpoint ck;
  const std::string path = file("ckpt.h5");
  write_checkpoint(path, ck.layers, ck.state);
  EXPECT_EQ(run_python("load " + path), 0);
}

}  // namespace
