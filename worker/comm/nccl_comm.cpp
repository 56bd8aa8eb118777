#include "worker/comm/nccl_comm.hpp"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/launch.hpp"
#include "worker/runtime/cuda/cuda_allocator.hpp"
#include "worker/runtime/cuda/cuda_backend.hpp"

namespace ht::cuda {
namespace {

// Bounds the staging memory: an all-gather of a chunk needs size x chunk on every rank.
constexpr size_t kChunkBytes = size_t(4) << 20;

void mpi_ok(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw std::runtime_error(std::string("NcclComm: ") + call + " failed: " + std::string(text, len));
}

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

struct NcclComm::State {
  int device = 0, rank = 0, size = 1;
  MPI_Comm mpi = MPI_COMM_NULL;
  bool owns_mpi = false;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::string aborted;  // why, once abort() ran
  std::unique_ptr<CudaAllocator> own_alloc;
  Allocator* alloc = nullptr;
  std::unique_ptr<DeviceScratch> send, gather;

  State(int device_, Allocator* staging, MPI_Comm mpi_, bool owns)
      : device(device_), mpi(mpi_), owns_mpi(owns) {
    CUDA_CHECK(cudaSetDevice(device));
    if (!staging) own_alloc = std::make_unique<CudaAllocator>("nccl comm", device, 0);
    alloc = staging ? staging : own_alloc.get();
    send = std::make_unique<DeviceScratch>(*alloc, "NCCL staging");
    gather = std::make_unique<DeviceScratch>(*alloc, "NCCL gather");
    // A blocking stream: it waits for the legacy default stream and vice versa.
    CUDA_CHECK(cudaStreamCreate(&stream));
  }

  ~State() {
    cudaSetDevice(device);
    if (comm) {
      (void)cudaStreamSynchronize(stream);
      (void)ncclCommDestroy(comm);
    }
    if (stream) (void)cudaStreamDestroy(stream);
    send.reset();
    gather.reset();
    if (owns_mpi && mpi != MPI_COMM_NULL && mpi_running()) MPI_Comm_free(&mpi);
    (void)cudaGetLastError();
  }

  void init(const ncclUniqueId& id, int rank_, int size_) {
    rank = rank_;
    size = size_;
    CUDA_CHECK(cudaSetDevice(device));
    NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  }

  // Every public call starts here: the right device on this thread, and no use after abort.
  void enter() {
    if (!aborted.empty()) throw CommAborted("NCCL comm was aborted: " + aborted);
    CUDA_CHECK(cudaSetDevice(device));
  }

  void wait() { CUDA_CHECK(cudaStreamSynchronize(stream)); }
};

NcclComm::NcclComm(MPI_Comm mpi_comm, int device, Allocator* staging)
    : s_(std::make_unique<State>(device, staging, mpi_comm, false)) {
  int rank = 0, size = 1;
  mpi_ok(MPI_Comm_rank(mpi_comm, &rank), "MPI_Comm_rank");
  mpi_ok(MPI_Comm_size(mpi_comm, &size), "MPI_Comm_size");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  mpi_ok(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, mpi_comm), "MPI_Bcast of the NCCL unique id");
  s_->init(id, rank, size);
}

NcclComm::NcclComm(const std::string& unique_id, int rank, int size, int device, Allocator* staging)
    : s_(std::make_unique<State>(device, staging, MPI_COMM_NULL, false)) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal)
    throw std::invalid_argument("NcclComm: a unique id has " + std::to_string(sizeof id.internal) +
                                " bytes, got " + std::to_string(unique_id.size()));
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  s_->init(id, rank, size);
}

NcclComm::NcclComm(std::unique_ptr<State> state) : s_(std::move(state)) {}

NcclComm::~NcclComm() = default;

std::string NcclComm::make_unique_id() {
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof id.internal);
}

int NcclComm::rank() const { return s_->rank; }
int NcclComm::size() const { return s_->size; }

void NcclComm::allreduce_sum(float* data, size_t count) {
  s_->enter();
  if (!count) return;
  // In pieces: a reduce-scatter (every rank sends sub-chunk r of its piece to rank r,
  // which sums them in rank order) and an all-gather of the sums. 2 (P-1)/P x count floats
  // leave each rank, as the cost model's ring, with the bits of the MPI and local comms.
  const int P = s_->size;
  const size_t piece = std::min(count, kChunkBytes / sizeof(float));
  const size_t sub = (piece + size_t(P) - 1) / size_t(P);  // equal parts: the last is padded
  float* padded = s_->gather->get_as<float>(2 * sub * size_t(P) + sub);
  float* received = padded + sub * size_t(P);
  float* sum = received + sub * size_t(P);
  for (size_t off = 0; off < count; off += piece) {
    const size_t len = std::min(piece, count - off);
    CUDA_CHECK(cudaMemsetAsync(padded, 0, sub * size_t(P) * sizeof(float), s_->stream));
    CUDA_CHECK(cudaMemcpyAsync(padded, data + off, len * sizeof(float), cudaMemcpyDeviceToDevice, s_->stream));
    NCCL_CHECK(ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (int r = 0; r < P && first == ncclSuccess; ++r) {
      first = ncclSend(padded + size_t(r) * sub, sub, ncclFloat, r, s_->comm, s_->stream);
      if (first == ncclSuccess) first = ncclRecv(received + size_t(r) * sub, sub, ncclFloat, r, s_->comm, s_->stream);
    }
    const ncclResult_t end = ncclGroupEnd();  // always closed, also after a failed post
    NCCL_CHECK(first);
    NCCL_CHECK(end);
    launch_sum_ranks(received, P, sub, sum, s_->stream);
    NCCL_CHECK(ncclAllGather(sum, padded, sub, ncclFloat, s_->comm, s_->stream));
    CUDA_CHECK(cudaMemcpyAsync(data + off, padded, len * sizeof(float), cudaMemcpyDeviceToDevice, s_->stream));
  }
  s_->wait();
}

void NcclComm::allreduce_sum_host(double* data, size_t count) {
  s_->enter();
  if (!count) return;
  const size_t chunk = std::min(count, kChunkBytes / sizeof(double));
  double* send = s_->send->get_as<double>(chunk);
  double* gathered = s_->gather->get_as<double>(chunk * size_t(s_->size));
  std::vector<double> all(chunk * size_t(s_->size));
  for (size_t off = 0; off < count; off += chunk) {
    const size_t len = std::min(chunk, count - off);
    CUDA_CHECK(cudaMemcpyAsync(send, data + off, len * sizeof(double), cudaMemcpyHostToDevice, s_->stream));
    NCCL_CHECK(ncclAllGather(send, gathered, len, ncclDouble, s_->comm, s_->stream));
    CUDA_CHECK(cudaMemcpyAsync(all.data(), gathered, len * s_->size * sizeof(double), cudaMemcpyDeviceToHost,
                               s_->stream));
    s_->wait();
    // Rank order from zero, as the MPI and local comms.
    for (size_t i = 0; i < len; ++i) {
      double sum = 0.0;
      for (int r = 0; r < s_->size; ++r) sum += all[size_t(r) * len + i];
      data[off + i] = sum;
    }
  }
}

void NcclComm::start_exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) {
  s_->enter();
  for (const SendMsg& m : sends)
    if (m.peer < 0 || m.peer >= s_->size) throw std::invalid_argument("NcclComm::exchange: bad send peer");
  for (const RecvMsg& m : recvs)
    if (m.peer < 0 || m.peer >= s_->size) throw std::invalid_argument("NcclComm::exchange: bad recv peer");
  // One group: NCCL posts everything at once (no deadlock whatever the order) and matches
  // the messages between a pair of ranks in the order they are issued.
  NCCL_CHECK(ncclGroupStart());
  ncclResult_t first = ncclSuccess;
  for (const SendMsg& m : sends)
    if (m.count && first == ncclSuccess)
      first = ncclSend(m.data, m.count, ncclFloat, m.peer, s_->comm, s_->stream);
  for (const RecvMsg& m : recvs)
    if (m.count && first == ncclSuccess)
      first = ncclRecv(m.data, m.count, ncclFloat, m.peer, s_->comm, s_->stream);
  const ncclResult_t end = ncclGroupEnd();  // always closed, also after a failed post
  NCCL_CHECK(first);
  NCCL_CHECK(end);
}

// The messages move on the comm's own stream: compute queued meanwhile runs beside them.
void NcclComm::finish_exchange() {
  s_->enter();
  s_->wait();
}

void NcclComm::broadcast_host(void* data, size_t bytes, int root) {
  s_->enter();
  if (!bytes) return;
  const size_t chunk = std::min(bytes, kChunkBytes);
  char* staging = s_->send->get_as<char>(chunk);
  char* host = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t len = std::min(chunk, bytes - off);
    if (s_->rank == root)
      CUDA_CHECK(cudaMemcpyAsync(staging, host + off, len, cudaMemcpyHostToDevice, s_->stream));
    NCCL_CHECK(ncclBroadcast(staging, staging, len, ncclUint8, root, s_->comm, s_->stream));
    CUDA_CHECK(cudaMemcpyAsync(host + off, staging, len, cudaMemcpyDeviceToHost, s_->stream));
    s_->wait();
  }
}

void NcclComm::barrier() {
  s_->enter();
  float* one = s_->send->get_as<float>(1);
  NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, s_->comm, s_->stream));
  s_->wait();
}

std::unique_ptr<Comm> NcclComm::split(int color) {
  s_->enter();
  if (color < 0) throw std::invalid_argument("NcclComm::split: color must be >= 0");
  if (s_->mpi != MPI_COMM_NULL) {
    MPI_Comm sub = MPI_COMM_NULL;
    mpi_ok(MPI_Comm_split(s_->mpi, color, s_->rank, &sub), "MPI_Comm_split");
    auto comm = std::make_unique<NcclComm>(sub, s_->device, s_->own_alloc ? nullptr : s_->alloc);
    comm->s_->owns_mpi = true;
    return comm;
  }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  auto state = std::make_unique<State>(s_->device, s_->own_alloc ? nullptr : s_->alloc, MPI_COMM_NULL, false);
  NCCL_CHECK(ncclCommSplit(s_->comm, color, s_->rank, &state->comm, nullptr));
  NCCL_CHECK(ncclCommCount(state->comm, &state->size));
  NCCL_CHECK(ncclCommUserRank(state->comm, &state->rank));
  return std::unique_ptr<Comm>(new NcclComm(std::move(state)));
#else
  throw std::runtime_error("NcclComm::split without MPI needs NCCL >= 2.18 (ncclCommSplit)");
#endif
}

void NcclComm::abort(const std::string& why) {
  s_->aborted = why.empty() ? "aborted" : why;
  cudaSetDevice(s_->device);
  if (s_->comm) (void)ncclCommAbort(s_->comm);  // wakes this rank's pending NCCL work
  s_->comm = nullptr;
  // Peers blocked in NCCL only learn of it when the job ends: MPI_Abort ends it.
  if (s_->mpi != MPI_COMM_NULL && mpi_running()) MPI_Abort(s_->mpi, 2);
}

}  // namespace ht::cuda

namespace ht {

std::unique_ptr<Comm> make_nccl_world_comm(ComputeBackend& backend) {
  auto* gpu = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (!gpu) throw std::invalid_argument("make_nccl_world_comm: the NCCL comm needs the cuda backend");
  return std::make_unique<cuda::NcclComm>(MPI_COMM_WORLD, gpu->device(), &gpu->allocator());
}

}  // namespace ht
