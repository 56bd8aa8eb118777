// Comm over NCCL on device buffers, bootstrapped over MPI: one rank per GPU, any number of
// nodes. Sums are an all-gather followed by a rank-order addition, so every rank gets the
// same bits as with the MPI and local comms. NCCL runs on its own blocking stream, which
// the legacy default stream (where CudaBackend works) orders against implicitly: a send
// sees every kernel queued before it, and each call returns once its data has landed.
// No NCCL or CUDA types here: the worker can include this header in every build.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "worker/comm/comm.hpp"
#include "worker/runtime/tensor.hpp"

namespace ht::cuda {

class NcclComm : public Comm {
 public:
  // Collective over `mpi_comm` (not owned): rank 0 makes the NCCL unique id, MPI_Bcast
  // hands it to the others. `device` is this rank's local GPU. Staging buffers come from
  // `staging` (the backend's allocator, so the budget counts them; it must outlive this
  // comm) or, when null, from plain cudaMalloc.
  NcclComm(MPI_Comm mpi_comm, int device, Allocator* staging = nullptr);
  // Without MPI (threads of one process, tests): every rank passes the same id.
  NcclComm(const std::string& unique_id, int rank, int size, int device, Allocator* staging = nullptr);
  static std::string make_unique_id();
  // Destroys the NCCL communicator and its stream; a new NcclComm can then be created on
  // the same MPI communicator (state recycle).
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override;
  int size() const override;
  void allreduce_sum_host(double* data, size_t count) override;
  void allreduce_sum(float* data, size_t count) override;
  void start_exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) override;
  void finish_exchange() override;
  void broadcast_host(void* data, size_t bytes, int root) override;
  void barrier() override;
  // Over MPI: MPI_Comm_split then a new NCCL communicator; without MPI: ncclCommSplit
  // (NCCL >= 2.18). Collective over this comm.
  std::unique_ptr<Comm> split(int color) override;
  // Aborts the NCCL communicator (pending operations return), then MPI_Abort when MPI is
  // running; afterwards every call throws CommAborted.
  void abort(const std::string& why) override;

  struct State;  // NCCL handles, stream and staging buffers (nccl_comm.cpp)

 private:
  explicit NcclComm(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace ht::cuda
