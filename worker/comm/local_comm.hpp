// Comm between shards that run as threads of one process: the embedded default of
// `halotrain train` outside MPI/Slurm. Backend memory moves through host memory with the
// backend's MemoryOps (for CUDA also between devices: a halo goes device -> host mailbox
// -> device, never peer to peer).
#pragma once

#include <memory>
#include <vector>

#include "worker/comm/comm.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

struct LocalHub;  // state shared by the threads of one comm

class LocalComm : public Comm {
 public:
  // Creates the comms of `size` threads; element i is rank i's. `memory` moves the
  // backend memory of exchange() and allreduce_sum() (default: host memory).
  static std::vector<std::unique_ptr<Comm>> create(int size, MemoryOps memory = {});

  LocalComm(std::shared_ptr<LocalHub> hub, int rank);
  ~LocalComm() override;

  int rank() const override { return rank_; }
  int size() const override;
  void allreduce_sum_host(double* data, size_t count) override;
  void allreduce_sum(float* data, size_t count) override;
  void start_exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) override;
  void finish_exchange() override;
  void broadcast_host(void* data, size_t bytes, int root) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color) override;
  void abort(const std::string& why) override;

 private:
  template <class T>
  void allreduce(T* data, size_t count);

  std::shared_ptr<LocalHub> hub_;
  int rank_;
  std::vector<RecvMsg> pending_;  // the receives of the exchange started

};

}  // namespace ht
