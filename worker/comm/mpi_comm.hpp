// Comm over MPI: one rank per shard under `mpirun -np P` or `srun`. Host memory.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "worker/comm/comm.hpp"

namespace ht {

// Throws with the file, line, the call and MPI's error string.
#define MPI_CHECK(call) ::ht::mpi_check((call), #call, __FILE__, __LINE__)
void mpi_check(int code, const char* call, const char* file, int line);

class MpiComm : public Comm {
 public:
  // Wraps `comm`; frees it on destruction when `owned`.
  MpiComm(MPI_Comm comm, bool owned);
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum_host(double* data, size_t count) override;
  void allreduce_sum(float* data, size_t count) override;
  void start_exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) override;
  void finish_exchange() override;
  void broadcast_host(void* data, size_t bytes, int root) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color) override;
  void abort(const std::string& why) override;
  MPI_Comm handle() const { return comm_; }

 private:
  template <class T>
  void allreduce(T* data, size_t count, MPI_Datatype type);

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> pending_;  // the requests of the exchange started
};

// True when this process was started by mpirun/srun with more than one rank, or under MPI.
bool launched_by_mpi();

}  // namespace ht
