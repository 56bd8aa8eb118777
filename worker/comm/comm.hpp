// Comm: how workers talk. Implementations only move bytes; what to move is decided by
// the ShardPlan (halo regions) and the trainer (reductions). Every sum is computed in
// rank order, so results never depend on timing and are identical on every rank.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ht {

// Another rank failed or the job is being torn down: stop waiting, unwind, exit.
class CommAborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One point-to-point message of a halo exchange, in backend memory.
struct SendMsg {
  int peer;
  const float* data;
  size_t count;
};
struct RecvMsg {
  int peer;
  float* data;
  size_t count;
};

// Chunk r of `parts` of [0, count), for reduce-scatters: [count*r/parts, count*(r+1)/parts).
struct chunk_range {
  size_t first = 0, size = 0;
};
inline chunk_range chunk_of(size_t count, int parts, int r) {
  const size_t lo = count * size_t(r) / size_t(parts), hi = count * size_t(r + 1) / size_t(parts);
  return {lo, hi - lo};
}

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sum over all ranks of this comm, in rank order; host memory.
  virtual void allreduce_sum_host(double* data, size_t count) = 0;
  // Same for backend memory (gradients).
  virtual void allreduce_sum(float* data, size_t count) = 0;
  // Posts every send and receive, returns when all receives have arrived. Messages between
  // one pair of ranks are matched in the order they are listed.
  void exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) {
    start_exchange(sends, recvs);
    finish_exchange();
  }
  // exchange() in two halves, so that work that needs neither buffer runs while the
  // messages are in flight: start_exchange posts them, finish_exchange returns when every
  // receive has arrived and the send buffers may be reused. Between the two the caller
  // leaves all the buffers alone. One exchange at a time per comm.
  virtual void start_exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) = 0;
  virtual void finish_exchange() = 0;
  virtual void broadcast_host(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ranks with the same color form a new comm, ordered by their rank here.
  virtual std::unique_ptr<Comm> split(int color) = 0;
  // Tells every other rank to stop waiting (a local failure); never returns to a wait.
  virtual void abort(const std::string& why) = 0;
};

class ComputeBackend;
// worker/comm/nccl_comm.cpp: the comm over every rank of MPI_COMM_WORLD on `backend`'s GPU
// (NCCL, bootstrapped over MPI; collective). Its staging buffers come from the backend's
// allocator: destroy it before the backend. Without CUDA (nccl_stub.cpp) it throws
// BackendUnavailable "built without CUDA".
std::unique_ptr<Comm> make_nccl_world_comm(ComputeBackend& backend);

}  // namespace ht
