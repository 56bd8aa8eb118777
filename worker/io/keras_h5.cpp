#include "worker/io/keras_h5.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>
#include <set>
#include <stdexcept>

#include "orchestrator/config.hpp"
#include "worker/io/h5.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the checksum hashes float32 LE bytes");

namespace ht {

namespace {

constexpr size_t kAttrLimit = 64512;  // Keras HDF5_OBJECT_HEADER_LIMIT: split lists above it

// SHA-256 (FIPS 180-4), streaming. Written out here to add no dependency; Python's
// hashlib checks it in the tests.
class Sha256 {
 public:
  void update(const void* data, size_t n) {
    auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    while (n > 0) {
      size_t take = std::min(n, size_t(64) - len_);
      std::copy(p, p + take, buf_ + len_);
      len_ += take, p += take, n -= take;
      if (len_ == 64) block(buf_), len_ = 0;
    }
  }
  std::string hex() {
    uint64_t bits = total_ * 8;
    uint8_t pad = 0x80, zero = 0;
    update(&pad, 1);
    while (len_ != 56) update(&zero, 1);
    uint8_t be[8];
    for (int i = 0; i < 8; ++i) be[i] = uint8_t(bits >> (56 - 8 * i));
    update(be, 8);
    std::string out;
    for (uint32_t v : h_) out += fmt::format("{:08x}", v);
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const uint8_t* p) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }
  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf_[64];
  size_t len_ = 0;
  uint64_t total_ = 0;
};

// The checksum's byte stream, as documented in keras_h5.hpp.
struct Hasher {
  Sha256 sha;
  void u64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));
    sha.update(b, 8);
  }
  void str0(const std::string& s) { sha.update(s.c_str(), s.size() + 1); }
  void header(const std::string& path, const h5::Shape& shape) {
    str0(path);
    u64(shape.size());
    for (int64_t d : shape) u64(uint64_t(d));
  }
  void floats(const float* p, int64_t n) { sha.update(p, size_t(n) * sizeof(float)); }
  void state(const HalotrainState& s) {
    str0("halotrain");
    for (int64_t v : {s.step, s.epoch, s.cursor, int64_t(s.format_version)}) u64(uint64_t(v));
    str0(s.model_hash);
    u64(s.rng_state.size());
    sha.update(s.rng_state.data(), s.rng_state.size());
    u64(s.config_text.size());
    sha.update(s.config_text.data(), s.config_text.size());
    for (const auto& [name, text] : {std::pair<const char*, const std::string&>{"monitors", s.monitors},
                                      {"data_identity", s.data_identity}}) {
      if (text.empty()) continue;
      str0(name);
      u64(text.size());
      sha.update(text.data(), text.size());
    }
  }
  std::string result() { return "sha256:" + sha.hex(); }
};

// Keras save_attributes_to_hdf5_group: one attribute, or `name0, name1, ...` split as
// np.array_split does (the first n % k parts one longer) when it would exceed 64 KiB.
void write_keras_list(hid_t obj, const std::string& name, const std::vector<std::string>& v) {
  size_t item = 1, n = v.size(), parts = 1;
  for (const auto& s : v) item = std::max(item, s.size());
  while (parts < n && ((n + parts - 1) / parts) * item > kAttrLimit) ++parts;
  if (parts == 1) return h5::write_attr_strings(obj, name, v);
  for (size_t k = 0, pos = 0; k < parts; ++k) {
    size_t len = n / parts + (k < n % parts ? 1 : 0);
    h5::write_attr_strings(obj, name + std::to_string(k), {v.begin() + long(pos), v.begin() + long(pos + len)});
    pos += len;
  }
}

bool has_keras_list(hid_t obj, const std::string& name) {
  return h5::has_attr(obj, name) || h5::has_attr(obj, name + "0");
}

// Keras load_attributes_from_hdf5_group.
std::vector<std::string> read_keras_list(hid_t obj, const std::string& name) {
  if (h5::has_attr(obj, name)) return h5::read_attr_strings(obj, name);
  std::vector<std::string> out;
  for (int k = 0; h5::has_attr(obj, name + std::to_string(k)); ++k) {
    auto part = h5::read_attr_strings(obj, name + std::to_string(k));
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::string stored_weight_name(const std::string& layer, const std::string& weight) {
  return weight.find('/') == std::string::npos ? layer + "/" + weight : weight;
}

void check_tensor(const std::string& what, const std::string& name, const std::vector<int64_t>& shape,
                  const float* data) {
  if (name.empty()) throw std::invalid_argument(fmt::format("{}: empty weight name", what));
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument(fmt::format("{} '{}': negative dimension", what, name));
  if (!data && h5::element_count(shape) > 0)
    throw std::invalid_argument(fmt::format("{} '{}': no data", what, name));
}

void validate(const std::vector<KerasLayerWeights>& layers, const HalotrainState& state) {
  std::set<std::string> seen;
  for (const auto& l : layers) {
    if (l.layer.empty() || l.layer.find('/') != std::string::npos || l.layer == "halotrain")
      throw std::invalid_argument(fmt::format("checkpoint: bad layer name '{}'", l.layer));
    if (!seen.insert(l.layer).second)
      throw std::invalid_argument(fmt::format("checkpoint: layer '{}' listed twice", l.layer));
    if (l.shapes.size() != l.weight_names.size() || l.data.size() != l.weight_names.size())
      throw std::invalid_argument(fmt::format("checkpoint: layer '{}' has {} names, {} shapes, {} data",
                                              l.layer, l.weight_names.size(), l.shapes.size(), l.data.size()));
    for (size_t i = 0; i < l.weight_names.size(); ++i)
      check_tensor("layer " + l.layer, l.weight_names[i], l.shapes[i], l.data[i]);
  }
  for (const auto& s : state.slots) check_tensor("slot", s.name, s.shape, s.data);
}

}  // namespace

void write_checkpoint(const std::string& path, const std::vector<KerasLayerWeights>& layers,
                      const HalotrainState& state) {
  validate(layers, state);
  h5::quiet();
  const std::string temp = h5::temp_path(path);
  try {
    {
      h5::Hid file = h5::create_file(temp);
      Hasher hash;
      std::vector<std::string> names;
      for (const auto& l : layers) names.push_back(l.layer);
      write_keras_list(file, "layer_names", names);
      h5::write_attr_string(file, "backend", "tensorflow");
      h5::write_attr_string(file, "keras_version", "2.1.6");
      for (const auto& l : layers) {
        h5::Hid g = h5::create_group(file, l.layer);
        std::vector<std::string> stored;
        for (const auto& w : l.weight_names) stored.push_back(stored_weight_name(l.layer, w));
        write_keras_list(g, "weight_names", stored);
        for (size_t i = 0; i < stored.size(); ++i) {
          h5::write_dataset(g, stored[i], l.shapes[i], l.data[i]);
          hash.header(l.layer + "/" + stored[i], l.shapes[i]);
          hash.floats(l.data[i], h5::element_count(l.shapes[i]));
        }
      }
      h5::Hid ht = h5::create_group(file, "halotrain");
      std::vector<std::string> slot_names;
      for (const auto& s : state.slots) {
        h5::write_dataset(ht, "slots/" + s.name, s.shape, s.data);
        hash.header("slots/" + s.name, s.shape);
        hash.floats(s.data, h5::element_count(s.shape));
        slot_names.push_back(s.name);
      }
      write_keras_list(ht, "slot_names", slot_names);
      h5::write_attr_int64(ht, "step", state.step);
      h5::write_attr_int64(ht, "epoch", state.epoch);
      h5::write_attr_int64(ht, "cursor", state.cursor);
      h5::write_attr_int64(ht, "format_version", state.format_version);
      h5::write_attr_string(ht, "model_hash", state.model_hash);
      h5::write_string_dataset(ht, "config_text", state.config_text);
      if (!state.monitors.empty()) h5::write_string_dataset(ht, "monitors", state.monitors);
      if (!state.data_identity.empty()) h5::write_string_dataset(ht, "data_identity", state.data_identity);
      h5::write_dataset(ht, "rng_state", {int64_t(state.rng_state.size())},
                        reinterpret_cast<const uint8_t*>(state.rng_state.data()));
      hash.state(state);
      h5::write_attr_string(ht, "checksum", hash.result());
      ht.close();
      file.close();  // a close flushes: its failure (disk full) must abort the commit
    }
    h5::commit_file(temp, path);
  } catch (const std::exception& e) {
    std::remove(temp.c_str());
    throw std::runtime_error(fmt::format("writing checkpoint {}: {}", path, e.what()));
  }
}

// ---- reading ----------------------------------------------------------------------

struct KerasWeightsFile::Impl {
  std::string path;
  h5::Hid file, root;  // root: "/" or "/model_weights"
  bool model_file = false;
  std::vector<std::string> layers;
  std::map<std::string, std::vector<std::string>> weights;

  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(fmt::format("{}: {}", path, what));
  }

  const std::vector<std::string>& weights_of(const std::string& layer) const {
    auto it = weights.find(layer);
    if (it == weights.end())
      fail(fmt::format("no layer '{}' (the file has {} layers: {}{})", layer, layers.size(),
                       fmt::join(layers.begin(), layers.begin() + long(std::min<size_t>(layers.size(), 12)), ", "),
                       layers.size() > 12 ? ", ..." : ""));
    return it->second;
  }

  std::string resolve(const std::string& layer, const std::string& weight) const {
    const auto& names = weights_of(layer);
    if (std::find(names.begin(), names.end(), weight) != names.end()) return weight;
    std::vector<std::string> hits;
    for (const auto& n : names)
      if (n.substr(n.rfind('/') + 1) == weight) hits.push_back(n);
    if (hits.size() != 1)
      fail(fmt::format("layer '{}' has {} weight '{}' (its weights: {})", layer,
                       hits.empty() ? "no" : "more than one", weight,
                       names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
    return hits.front();
  }

  h5::Hid dataset(const std::string& layer, const std::string& weight) const {
    std::string stored = resolve(layer, weight), at = layer + "/" + stored;
    if (!h5::is_dataset(root, at))
      fail(fmt::format("layer '{}' lists weight '{}' but there is no dataset {}{}", layer, stored,
                       model_file ? "model_weights/" : "", at));
    return h5::open_dataset(root, at);
  }

  // A weight's dataset, refused unless it holds numbers.
  h5::Hid numeric_dataset(const std::string& layer, const std::string& weight) const {
    h5::Hid ds = dataset(layer, weight);
    h5::Hid type = h5::type_id(H5_CHECK(H5Dget_type(ds)));
    auto tc = h5::type_class(type);
    if (tc == h5::TypeClass::String || tc == h5::TypeClass::Other)
      fail(fmt::format("layer '{}' weight '{}' has dtype {}, expected numbers", layer, weight, h5::type_name(type)));
    return ds;
  }

  // Reads the box [start, start + count) of `ds` as float32; `what` names it in errors.
  void read_box(hid_t ds, const h5::Shape& start, const h5::Shape& count, float* dst,
                const std::string& what) const {
    try {
      const h5::Shape shape = h5::dataset_shape(ds);
      bool inside = start.size() == shape.size() && count.size() == shape.size();
      for (size_t d = 0; inside && d < shape.size(); ++d)
        inside = start[d] >= 0 && count[d] >= 0 && start[d] + count[d] <= shape[d];
      if (!inside)
        fail(fmt::format("reading {}: the box at {} of {} is outside its shape {}", what, h5::shape_string(start),
                         h5::shape_string(count), h5::shape_string(shape)));
      if (shape.empty())
        h5::read_dataset(ds, dst, 1);
      else
        h5::read_hyperslab(ds, start, count, H5T_NATIVE_FLOAT, dst);
    } catch (const h5::H5Error& e) {
      fail(fmt::format("reading {} failed: {}", what, e.what()));
    }
  }

  h5::Hid halotrain() const {
    if (!h5::is_group(file, "halotrain"))
      fail("not a halotrain checkpoint: no /halotrain group (a plain Keras weights file)");
    return h5::open_group(file, "halotrain");
  }

  h5::Hid slot(hid_t ht, const std::string& name) const {
    if (!h5::is_dataset(ht, "slots/" + name)) fail(fmt::format("no optimizer slot '{}' in /halotrain/slots", name));
    return h5::open_dataset(ht, "slots/" + name);
  }

  // Hashes a dataset as float32, a few MiB at a time along its first axis.
  static void hash_dataset(Hasher& hash, hid_t ds, const std::string& name) {
    h5::Shape shape = h5::dataset_shape(ds);
    hash.header(name, shape);
    int64_t total = h5::element_count(shape);
    if (total == 0) return;
    std::vector<float> buf;
    if (shape.empty()) {
      buf.resize(1);
      h5::read_dataset(ds, buf.data(), 1);
      return hash.floats(buf.data(), 1);
    }
    int64_t row = total / shape[0], step = std::max<int64_t>(1, (int64_t(1) << 20) / row);
    for (int64_t r = 0; r < shape[0]; r += step) {
      h5::Shape start(shape.size(), 0), count = shape;
      start[0] = r;
      count[0] = std::min(step, shape[0] - r);
      buf.resize(size_t(h5::element_count(count)));
      h5::read_hyperslab(ds, start, count, H5T_NATIVE_FLOAT, buf.data());
      hash.floats(buf.data(), int64_t(buf.size()));
    }
  }
};

KerasWeightsFile::KerasWeightsFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  std::string why = h5::why_not_readable(path);
  if (!why.empty()) m.fail(why);
  try {
    m.file = h5::open_file(path);
    if (has_keras_list(m.file, "layer_names")) {
      m.root = h5::open_group(m.file, "/");
    } else if (h5::is_group(m.file, "model_weights") &&
               has_keras_list(h5::open_group(m.file, "model_weights"), "layer_names")) {
      m.root = h5::open_group(m.file, "model_weights");
      m.model_file = true;
    } else {
      m.fail("not a Keras weights file: no 'layer_names' attribute at / or /model_weights");
    }
    m.layers = read_keras_list(m.root, "layer_names");
    for (const auto& layer : m.layers) {
      if (!h5::is_group(m.root, layer))
        m.fail(fmt::format("layer '{}' is in layer_names but has no group", layer));
      h5::Hid g = h5::open_group(m.root, layer);
      m.weights[layer] = read_keras_list(g, "weight_names");
    }
  } catch (const h5::H5Error& e) {
    m.fail(fmt::format("cannot read as a Keras weights file: {}", e.what()));
  }
}

KerasWeightsFile::~KerasWeightsFile() = default;
KerasWeightsFile::KerasWeightsFile(KerasWeightsFile&&) noexcept = default;
KerasWeightsFile& KerasWeightsFile::operator=(KerasWeightsFile&&) noexcept = default;

const std::string& KerasWeightsFile::path() const { return impl_->path; }
bool KerasWeightsFile::is_model_file() const { return impl_->model_file; }
std::string KerasWeightsFile::keras_version() const {
  return h5::has_attr(impl_->root, "keras_version") ? h5::read_attr_string(impl_->root, "keras_version") : "";
}
std::string KerasWeightsFile::backend() const {
  return h5::has_attr(impl_->root, "backend") ? h5::read_attr_string(impl_->root, "backend") : "";
}
const std::vector<std::string>& KerasWeightsFile::layer_names() const { return impl_->layers; }
const std::vector<std::string>& KerasWeightsFile::weight_names(const std::string& layer) const {
  return impl_->weights_of(layer);
}

std::vector<int64_t> KerasWeightsFile::shape(const std::string& layer, const std::string& weight) const {
  h5::quiet();
  return h5::dataset_shape(impl_->dataset(layer, weight));
}

void KerasWeightsFile::read(const std::string& layer, const std::string& weight, float* dst) const {
  h5::quiet();
  h5::Hid ds = impl_->numeric_dataset(layer, weight);
  try {
    h5::read_dataset(ds, dst, h5::element_count(h5::dataset_shape(ds)));
  } catch (const h5::H5Error& e) {
    impl_->fail(fmt::format("reading layer '{}' weight '{}' failed: {}", layer, weight, e.what()));
  }
}

void KerasWeightsFile::read(const std::string& layer, const std::string& weight, const std::vector<int64_t>& start,
                            const std::vector<int64_t>& count, float* dst) const {
  h5::quiet();
  impl_->read_box(impl_->numeric_dataset(layer, weight), start, count, dst,
                  fmt::format("layer '{}' weight '{}'", layer, weight));
}

bool KerasWeightsFile::has_halotrain() const { return h5::is_group(impl_->file, "halotrain"); }

HalotrainState KerasWeightsFile::read_state() const {
  h5::quiet();
  const Impl& m = *impl_;
  h5::Hid ht = m.halotrain();
  HalotrainState s;
  try {
    for (const char* a : {"step", "epoch", "cursor", "format_version", "model_hash"})
      if (!h5::has_attr(ht, a)) m.fail(fmt::format("checkpoint is missing /halotrain attribute '{}'", a));
    for (const char* d : {"config_text", "rng_state"})
      if (!h5::is_dataset(ht, d)) m.fail(fmt::format("checkpoint is missing dataset /halotrain/{}", d));
    s.step = h5::read_attr_int64(ht, "step");
    s.epoch = h5::read_attr_int64(ht, "epoch");
    s.cursor = h5::read_attr_int64(ht, "cursor");
    s.format_version = int(h5::read_attr_int64(ht, "format_version"));
    if (s.format_version > kCheckpointFormatVersion)
      m.fail(fmt::format("checkpoint format_version {} is newer than this halotrain reads ({})",
                         s.format_version, kCheckpointFormatVersion));
    s.model_hash = h5::read_attr_string(ht, "model_hash");
    s.config_text = h5::read_string_dataset(ht, "config_text");
    if (h5::is_dataset(ht, "monitors")) s.monitors = h5::read_string_dataset(ht, "monitors");
    if (h5::is_dataset(ht, "data_identity")) s.data_identity = h5::read_string_dataset(ht, "data_identity");
    h5::Hid rng = h5::open_dataset(ht, "rng_state");
    s.rng_state.resize(size_t(h5::element_count(h5::dataset_shape(rng))));
    h5::read_dataset(rng, reinterpret_cast<uint8_t*>(s.rng_state.data()), int64_t(s.rng_state.size()));
    for (const auto& name : read_keras_list(ht, "slot_names"))
      s.slots.push_back({name, h5::dataset_shape(m.slot(ht, name)), nullptr});
  } catch (const h5::H5Error& e) {
    m.fail(fmt::format("cannot read /halotrain: {}", e.what()));
  }
  return s;
}

std::vector<int64_t> KerasWeightsFile::slot_shape(const std::string& name) const {
  h5::quiet();
  return h5::dataset_shape(impl_->slot(impl_->halotrain(), name));
}

void KerasWeightsFile::read_slot(const std::string& name, float* dst) const {
  h5::quiet();
  h5::Hid ds = impl_->slot(impl_->halotrain(), name);
  try {
    h5::read_dataset(ds, dst, h5::element_count(h5::dataset_shape(ds)));
  } catch (const h5::H5Error& e) {
    impl_->fail(fmt::format("reading optimizer slot '{}' failed: {}", name, e.what()));
  }
}

void KerasWeightsFile::read_slot(const std::string& name, const std::vector<int64_t>& start,
                                 const std::vector<int64_t>& count, float* dst) const {
  h5::quiet();
  impl_->read_box(impl_->slot(impl_->halotrain(), name), start, count, dst,
                  fmt::format("optimizer slot '{}'", name));
}

std::string KerasWeightsFile::stored_checksum() const {
  h5::Hid ht = impl_->halotrain();
  return h5::has_attr(ht, "checksum") ? h5::read_attr_string(ht, "checksum") : "";
}

std::string KerasWeightsFile::computed_checksum() const {
  h5::quiet();
  const Impl& m = *impl_;
  HalotrainState state = read_state();
  Hasher hash;
  for (const auto& layer : m.layers)
    for (const auto& w : m.weights_of(layer)) Impl::hash_dataset(hash, m.dataset(layer, w), layer + "/" + w);
  h5::Hid ht = m.halotrain();
  for (const auto& s : state.slots) Impl::hash_dataset(hash, m.slot(ht, s.name), "slots/" + s.name);
  hash.state(state);
  return hash.result();
}

bool KerasWeightsFile::verify_checksum() const {
  std::string stored = stored_checksum();
  if (stored.empty()) return false;
  try {
    return computed_checksum() == stored;
  } catch (const h5::H5Error&) {
    return false;  // unreadable data: damaged
  } catch (const ConfigError&) {
    if (!has_halotrain()) throw;
    return false;  // a part the checksum covers is missing
  }
}

// ---- inspect ----------------------------------------------------------------------

int inspect_file(const std::string& path, std::ostream& out) {
  KerasWeightsFile f(path);
  std::string version = f.keras_version(), backend = f.backend();
  out << fmt::format("{}: Keras {} file (keras_version {}, backend {})\n", path,
                     f.is_model_file() ? "model (model.save, weights under /model_weights)" : "weights",
                     version.empty() ? "missing" : version, backend.empty() ? "missing" : backend);
  int64_t params = 0, with_weights = 0;
  for (const auto& layer : f.layer_names()) with_weights += f.weight_names(layer).empty() ? 0 : 1;
  out << fmt::format("layers: {} ({} with weights)\n", f.layer_names().size(), with_weights);
  for (const auto& layer : f.layer_names()) {
    const auto& names = f.weight_names(layer);
    out << "  " << layer << (names.empty() ? "  (no weights)\n" : "\n");
    for (const auto& w : names) {
      auto shape = f.shape(layer, w);
      params += h5::element_count(shape);
      out << fmt::format("    {:<36} {}\n", w, h5::shape_string(shape));
    }
  }
  out << fmt::format("parameters: {}\n", params);
  if (!f.has_halotrain()) {
    out << "halotrain: none (a plain Keras file: no step, epoch, data cursor, RNG state, optimizer "
           "slots, config or checksum; usable as training.init_weights, not to resume)\n";
    return 0;
  }
  h5::Hid file = h5::open_file(path);
  h5::Hid ht = h5::open_group(file, "halotrain");
  std::vector<std::string> missing;
  for (const char* a : {"step", "epoch", "cursor", "format_version", "model_hash", "checksum"})
    if (!h5::has_attr(ht, a)) missing.push_back(fmt::format("attribute {}", a));
  if (!has_keras_list(ht, "slot_names")) missing.push_back("attribute slot_names");
  for (const char* d : {"config_text", "rng_state"})
    if (!h5::is_dataset(ht, d)) missing.push_back(fmt::format("dataset {}", d));
  if (!missing.empty()) {
    out << fmt::format("halotrain: INCOMPLETE, missing {}\n", fmt::join(missing, ", "));
    return 1;
  }
  HalotrainState s = f.read_state();
  int64_t slot_values = 0;
  for (const auto& slot : s.slots) slot_values += h5::element_count(slot.shape);
  out << "halotrain:\n";
  out << fmt::format("  format_version: {}\n  step: {}\n  epoch: {}\n  cursor: {}\n", s.format_version,
                     s.step, s.epoch, s.cursor);
  out << fmt::format("  model_hash: {}\n  config: {} bytes\n  rng_state: {} bytes\n", s.model_hash,
                     s.config_text.size(), s.rng_state.size());
  out << fmt::format("  slots: {} ({} values)\n", s.slots.size(), slot_values);
  if (!s.monitors.empty()) out << fmt::format("  monitors: {}\n", s.monitors);
  if (!s.data_identity.empty()) out << fmt::format("  data identity: {} bytes (a manifest's rows and files)\n", s.data_identity.size());
  bool ok = f.verify_checksum();
  out << fmt::format("  checksum: {} ({})\n", ok ? "OK" : "FAILED", f.stored_checksum());
  return ok ? 0 : 1;
}

}  // namespace ht
