// The data order and the tiles one rank reads. Training: the sample stream is the
// concatenation of per-epoch permutations (splitmix64 Fisher-Yates from `seed` and the
// epoch; identity without shuffle); step s takes stream positions [s*B, (s+1)*B), its
// micro-batch m (training.accumulate = k) the positions [s*B + m*B/k, s*B + (m+1)*B/k),
// and sample group g the g-th slice of that. Augmentation (flips, crop window) is drawn
// from (seed, step, image index) alone. Identical on every rank, resumable from the step.
// Evaluation and prediction: every image of a file once, in file order, in rounds of one
// micro-batch per group, with the crop window (if any) at the centre.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "orchestrator/plan.hpp"
#include "orchestrator/shard_plan.hpp"
#include "worker/io/data_reader.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

struct Batch {
  Tensor images;                // [b, C, tile rows, tile cols]
  std::vector<int32_t> labels;  // [b] when the targets are labels
  Tensor targets;               // [b, 1, rows, cols] masks, or [b, units, 1, 1] one-hot/values
  std::vector<float> host_targets;  // the same on the host (evaluation computes there)
  std::vector<int64_t> samples; // file indices, for messages
  int64_t batch_position = 0;   // training: the position of image 0 in its step's batch
  std::vector<char> valid;      // evaluation: 0 for the repeats that fill the last round
};

enum class DataPurpose {
  Train,     // data.train, shuffled and augmented
  Evaluate,  // a file in order, with its targets
  Predict,   // a file in order, images only
};

// The draws of one training image (SPEC section 8): a function of (seed, step, index).
SampleView augment_view(const Config& config, int64_t step, int64_t sample, int view_height, int view_width);

// What the manifests among data.train and data.validation decode whole (orchestrator/plan.hpp
// WholeDecodes), from their files' headers; ConfigError as a run's reader would say it.
// With `input` (evaluate --data, predict --input): that file alone, read for `purpose`.
WholeDecodes data_whole_decodes(const Config& config, const ModelSpec& model, const std::string& input = "",
                                DataPurpose purpose = DataPurpose::Evaluate);

class BatchSource {
 public:
  // `path`: the file to read; empty for data.train.
  BatchSource(const Config& config, const ShardPlan& plan, int rank, ComputeBackend& backend,
              DataPurpose purpose = DataPurpose::Train, const std::string& path = "");
  ~BatchSource();

  int64_t samples() const;  // images in the file
  int64_t epoch_of_step(int64_t step) const;
  int micro_batch() const { return micro_batch_; }  // images per group per micro-batch
  // Training: micro-batch `micro` of step `step`. With `next_step`/`next_micro` >= 0 the
  // micro-batch after it is then read on a background thread while this one computes;
  // its tensors are allocated here, on the calling thread, so the memory model counts
  // them (on the CPU backend the tiles land in them directly; on CUDA in host buffers,
  // uploaded when that micro-batch is loaded).
  Batch load(int64_t step, int micro = 0, int64_t next_step = -1, int next_micro = 0);
  // Evaluation and prediction: round r takes images [r*G*b, (r+1)*G*b) of the file, group
  // g the g-th b of them; past the end a group repeats the last image, marked not valid.
  int64_t rounds() const;
  Batch load_round(int64_t round);
  const DataReader& reader() const { return *reader_; }
  // Points at the backend again after the trainer rebuilt its device state; a read under
  // way is waited for and dropped first (its tensors are the old backend's).
  void rebind(ComputeBackend* backend);

 private:
  struct Pending;
  int64_t sample_at(int64_t position);
  void training_samples(int64_t step, int micro, std::vector<int64_t>& samples, std::vector<SampleView>& views,
                        int64_t& first);
  Batch allocate(int b);  // the batch's tensors, on the backend
  // The tiles (into `images`, host memory) and targets of `samples`; any thread.
  void fill(Batch& batch, float* images, const std::vector<SampleView>& views);
  void upload(Batch& batch, const float* images);  // host buffers to the batch's tensors
  Batch read(const std::vector<int64_t>& samples, const std::vector<SampleView>& views);
  void start_prefetch(int64_t step, int micro);
  void cancel_prefetch();

  const Config& config_;
  const ShardPlan& plan_;
  int rank_;
  ComputeBackend* backend_;
  DataPurpose purpose_;
  int micro_batch_;
  std::unique_ptr<DataReader> reader_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> permutation_;
  std::unique_ptr<Pending> pending_;  // the micro-batch being read in the background
};

// The permutation of [0, n) for `epoch`: shared with the Python oracle (tests/python).
std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n, bool shuffle);

}  // namespace ht
