// Keras 2 weights files (SPEC section 4): halotrain checkpoints are what Keras 2.1.6
// `model.save_weights()` writes, plus a `/halotrain` group that Keras ignores. Reading
// accepts save_weights files and `model.save()` files (weights under `model_weights`).
// Everything streams one dataset at a time: no whole-file loads.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace ht {

constexpr int kCheckpointFormatVersion = 1;

// One layer as Keras lists it. Weightless layers (relu, pools) have empty vectors: Keras
// lists every layer in `layer_names`.
struct KerasLayerWeights {
  std::string layer;                         // "conv2d_1"
  std::vector<std::string> weight_names;     // "kernel:0", "bias:0" (a name with '/' is kept)
  std::vector<std::vector<int64_t>> shapes;  // Keras layout: conv (kh, kw, cin, cout)
  std::vector<const float*> data;            // already in Keras layout
};

// A named tensor under /halotrain/slots (optimizer moments, ...). '/' in a name makes
// subgroups. Read back with data == nullptr: use KerasWeightsFile::read_slot.
struct HalotrainSlot {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

struct HalotrainState {
  int64_t step = 0, epoch = 0, cursor = 0;  // cursor: position in the epoch's data order
  std::string rng_state;                    // opaque bytes (stored as a uint8 dataset)
  std::string config_text;
  std::string model_hash;
  int format_version = kCheckpointFormatVersion;
  std::vector<HalotrainSlot> slots;
  // The validation monitors' state as JSON (worker/run/monitors.hpp); "" when the run has none.
  std::string monitors;
  // data.train's identity when it is a manifest (worker/io/manifest.hpp); "" otherwise.
  std::string data_identity;
};

// Writes a checkpoint: root attributes layer_names / backend="tensorflow" /
// keras_version="2.1.6"; per layer a group with attribute weight_names ("conv2d_1/kernel:0"
// as Keras stores them) and datasets `<layer>/<layer>/<weight>` (float32); and /halotrain:
// attributes step, epoch, cursor, format_version, model_hash, slot_names, checksum;
// datasets config_text (string), rng_state (uint8), slots/<name>. Attribute lists over
// 64 KiB are split into `name0, name1, ...` as Keras does.
//
// checksum = "sha256:<hex>" of, in order: every weight (layer_names order, then
// weight_names order), then every slot (slot_names order), each as
// `<path>\0` + rank (u64 LE) + dims (i64 LE) + float32 LE data, where <path> is
// "<layer>/<stored weight name>" or "slots/<name>"; then "halotrain\0" + step, epoch,
// cursor, format_version (i64 LE) + model_hash + "\0" + len (u64 LE) + rng_state +
// len (u64 LE) + config_text; then, when the dataset `monitors` (string) is present,
// "monitors\0" + len (u64 LE) + its text; the same for `data_identity`.
//
// Crash-safe: written to `path.tmp-<pid>`, fsynced, renamed onto `path`, directory
// fsynced. On any error the temp file is removed and std::runtime_error names `path`
// (std::invalid_argument for inconsistent arguments, before anything is written).
void write_checkpoint(const std::string& path, const std::vector<KerasLayerWeights>& layers,
                      const HalotrainState& state);

// A Keras weights file opened for reading. User-facing problems (missing file, not HDF5,
// not Keras, unknown layer/weight, missing halotrain parts) throw ConfigError naming the
// file, layer and weight. One object per thread.
class KerasWeightsFile {
 public:
  explicit KerasWeightsFile(const std::string& path);
  ~KerasWeightsFile();
  KerasWeightsFile(KerasWeightsFile&&) noexcept;
  KerasWeightsFile& operator=(KerasWeightsFile&&) noexcept;

  const std::string& path() const;
  bool is_model_file() const;  // weights under /model_weights (a model.save file)
  std::string keras_version() const;  // "" when absent
  std::string backend() const;

  const std::vector<std::string>& layer_names() const;
  // As stored (Keras: "conv2d_1/kernel:0"); empty for weightless layers.
  const std::vector<std::string>& weight_names(const std::string& layer) const;
  // `weight` is a stored name or its last component ("kernel:0") when that is unique.
  std::vector<int64_t> shape(const std::string& layer, const std::string& weight) const;
  // Reads one dataset, converted to float32, into `dst` (room for every element of
  // shape(layer, weight)).
  void read(const std::string& layer, const std::string& weight, float* dst) const;
  // Reads the box [start, start + count) (one entry per dimension) of one weight, row-major
  // float32: loading stages a block of a tensor, never more than the tensor.
  void read(const std::string& layer, const std::string& weight, const std::vector<int64_t>& start,
            const std::vector<int64_t>& count, float* dst) const;

  bool has_halotrain() const;
  // Scalars, strings and slot names/shapes (slot data stays on disk: read_slot).
  HalotrainState read_state() const;
  std::vector<int64_t> slot_shape(const std::string& name) const;
  void read_slot(const std::string& name, float* dst) const;
  void read_slot(const std::string& name, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                 float* dst) const;
  std::string stored_checksum() const;    // "" when absent
  std::string computed_checksum() const;  // streams every dataset once
  // True when the stored checksum matches the data; false when it differs, is missing,
  // or a dataset cannot be read (a damaged file). ConfigError without /halotrain.
  bool verify_checksum() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `halotrain inspect`: layers, weight names and shapes; for halotrain checkpoints the
// step, epoch, cursor, model hash, format version, slots and checksum OK/FAILED; for plain
// Keras files which halotrain parts are missing. Returns 0, or 1 when the checksum fails
// or the /halotrain group is incomplete. Throws ConfigError when the file cannot be read
// as a Keras weights file.
int inspect_file(const std::string& path, std::ostream& out);

}  // namespace ht
