#include "worker/comm/mpi_comm.hpp"

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
  // A reduce-scatter, then an all-gather: rank r sums chunk r of every rank's data in rank
  // order (from zero), and everyone gathers the sums. 2 (P-1)/P x count elements leave each
  // rank, what a ring would send and what the cost model assumes, and every element is the
  // same rank-ordered sum as in the local comm, whatever algorithms MPI would choose.
  const int P = size_;
  if (P == 1 || count == 0) return;
  std::vector<int> counts(P), displs(P);
  for (int r = 0; r < P; ++r) {
    const chunk_range c = chunk_of(count, P, r);
    counts[size_t(r)] = int(c.size);
    displs[size_t(r)] = int(c.first);
  }
  const int mine = counts[size_t(rank_)];
  std::vector<int> from(P, mine), at(P);
  for (int r = 0; r < P; ++r) at[size_t(r)] = r * mine;
  std::vector<T> chunks(size_t(mine) * size_t(P));
  MPI_CHECK(MPI_Alltoallv(data, counts.data(), displs.data(), type, chunks.data(), from.data(), at.data(), type,
                          comm_));
  std::vector<T> sum(size_t(mine), T(0));
  for (int r = 0; r < P; ++r) {
    const T* src = chunks.data() + size_t(r) * size_t(mine);
    for (int i = 0; i < mine; ++i) sum[size_t(i)] += src[i];
  }
  MPI_CHECK(MPI_Allgatherv(sum.data(), mine, type, data, counts.data(), displs.data(), type, comm_));
}

void MpiComm::allreduce_sum_host(double* data, size_t count) { allreduce(data, count, MPI_DOUBLE); }
void MpiComm::allreduce_sum(float* data, size_t count) { allreduce(data, count, MPI_FLOAT); }

void MpiComm::start_exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) {
  pending_.assign(sends.size() + recvs.size(), MPI_REQUEST_NULL);
  size_t k = 0;
  for (const RecvMsg& r : recvs)
    MPI_CHECK(MPI_Irecv(r.data, int(r.count), MPI_FLOAT, r.peer, 0, comm_, &pending_[k++]));
  for (const SendMsg& s : sends)
    MPI_CHECK(MPI_Isend(const_cast<float*>(s.data), int(s.count), MPI_FLOAT, s.peer, 0, comm_, &pending_[k++]));
}

void MpiComm::finish_exchange() {
  std::vector<MPI_Request> requests = std::move(pending_);
  pending_.clear();
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
