#include "worker/mpi_comm.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace ht {

void mpi_check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw std::runtime_error(fmt::format("{}:{}: {} failed: {}", file, line, call, std::string(text, len)));
}

MpiComm::MpiComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiComm::~MpiComm() {
  if (owned_) MPI_Comm_free(&comm_);
}

template <class T>
void MpiComm::allreduce(T* data, size_t count, MPI_Datatype type) {
  // Gather everything, then sum in rank order: the same bits on every rank and in the
  // local comm, whatever reduction algorithm MPI would choose.
  std::vector<T> all(count * size_t(size_));
  MPI_CHECK(MPI_Allgather(data, int(count), type, all.data(), int(count), type, comm_));
  for (size_t i = 0; i < count; ++i) data[i] = T(0);
  for (int r = 0; r < size_; ++r) {
    const T* src = all.data() + size_t(r) * count;
    for (size_t i = 0; i < count; ++i) data[i] += src[i];
  }
}

void MpiComm::allreduce_sum_host(double* data, size_t count) { allreduce(data, count, MPI_DOUBLE); }
void MpiComm::allreduce_sum(float* data, size_t count) { allreduce(data, count, MPI_FLOAT); }

void MpiComm::exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) {
  std::vector<MPI_Request> requests(sends.size() + recvs.size());
  size_t k = 0;
  for (const RecvMsg& r : recvs)
    MPI_CHECK(MPI_Irecv(r.data, int(r.count), MPI_FLOAT, r.peer, 0, comm_, &requests[k++]));
  for (const SendMsg& s : sends)
    MPI_CHECK(MPI_Isend(const_cast<float*>(s.data), int(s.count), MPI_FLOAT, s.peer, 0, comm_, &requests[k++]));
  MPI_CHECK(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
}

void MpiComm::broadcast_host(void* data, size_t bytes, int root) {
  MPI_CHECK(MPI_Bcast(data, int(bytes), MPI_BYTE, root, comm_));
}

void MpiComm::barrier() { MPI_CHECK(MPI_Barrier(comm_)); }

std::unique_ptr<Comm> MpiComm::split(int color) {
  MPI_Comm sub;
  MPI_CHECK(MPI_Comm_split(comm_, color, rank_, &sub));
  return std::make_unique<MpiComm>(sub, true);
}

void MpiComm::abort(const std::string& why) { MPI_Abort(comm_, 2); }

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_NUM_TASKS"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace ht
