// The data order and the tiles one rank reads for each step. The sample stream is the
// concatenation of per-epoch permutations (splitmix64 Fisher-Yates from `seed` and the
// epoch; identity without shuffle); step s takes stream positions [s*B, (s+1)*B), and
// sample group g the slice [g*b, (g+1)*b). Identical on every rank, resumable from the
// step alone.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "orchestrator/shard_plan.hpp"
#include "worker/backend.hpp"

namespace ht {

class DataReader;

struct Batch {
  Tensor images;                // [b, C, tile rows, tile cols]
  std::vector<int32_t> labels;  // [b] when the targets are labels
  Tensor targets;               // [b, 1, rows, cols] masks, or [b, units, 1, 1] one-hot/values
  std::vector<int64_t> samples; // file indices, for messages
};

class BatchSource {
 public:
  BatchSource(const Config& config, const ShardPlan& plan, int rank, ComputeBackend& backend);
  ~BatchSource();

  int64_t samples() const;  // images in the file
  int64_t epoch_of_step(int64_t step) const;
  Batch load(int64_t step);
  // Points at the backend again after the trainer rebuilt its device state.
  void rebind(ComputeBackend* backend) { backend_ = backend; }

 private:
  int64_t sample_at(int64_t position);

  const Config& config_;
  const ShardPlan& plan_;
  int rank_;
  ComputeBackend* backend_;
  std::unique_ptr<DataReader> reader_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

// The permutation of [0, n) for `epoch`: shared with the Python oracle (tests/python).
std::vector<int64_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n, bool shuffle);

}  // namespace ht
