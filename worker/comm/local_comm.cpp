#include "worker/comm/local_comm.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

namespace ht {

struct LocalHub {
  LocalHub(int n, MemoryOps ops) : size(n), memory(ops), slots(n), colors(n) {}
  const int size;
  const MemoryOps memory;  // backend memory <-> host, for every rank of this comm
  std::mutex mu;
  std::condition_variable cv;
  // Barrier state: `generation` advances each time all `size` ranks have arrived.
  int arrived = 0;
  uint64_t generation = 0;
  // Collective inputs, one pointer per rank, valid between the two barriers of a collective.
  std::vector<const void*> slots;
  std::vector<int> colors;
  // Point-to-point mailboxes keyed by (source, destination), in posting order.
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> mail;
  // Sub-comms made by split(), keyed by (barrier generation of the split, color).
  std::map<std::pair<uint64_t, int>, std::shared_ptr<LocalHub>> children;
  std::vector<std::weak_ptr<LocalHub>> all_children;
  bool aborted = false;
  std::string why;

  void check() const {
    if (aborted) throw CommAborted("another shard failed: " + why);
  }
  void barrier(std::unique_lock<std::mutex>& lock) {
    check();
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    check();
  }
  void abort_all(const std::string& reason) {
    // Called with `mu` held; children are aborted too so no sub-comm waits forever.
    if (!aborted) {
      aborted = true;
      why = reason;
    }
    cv.notify_all();
    for (auto& weak : all_children)
      if (auto child = weak.lock()) {
        std::lock_guard<std::mutex> g(child->mu);
        child->abort_all(reason);
      }
  }
};

std::vector<std::unique_ptr<Comm>> LocalComm::create(int size, MemoryOps memory) {
  auto hub = std::make_shared<LocalHub>(size, memory);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<LocalComm>(hub, r));
  return comms;
}

LocalComm::LocalComm(std::shared_ptr<LocalHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
LocalComm::~LocalComm() = default;

int LocalComm::size() const { return hub_->size; }

template <class T>
void LocalComm::allreduce(T* data, size_t count) {
  // As the MPI comm: rank r sums chunk r of every rank's input in rank order (from zero),
  // then every rank copies the other chunks from their owners, so each reads O(count) and
  // the sum is the same bits on every rank and in either comm. The barriers keep every
  // input alive until its chunk is summed, and every sum until it is copied.
  const int P = hub_->size;
  const chunk_range mine = chunk_of(count, P, rank_);
  std::vector<T> sum(mine.size, T(0));
  std::unique_lock<std::mutex> lock(hub_->mu);
  hub_->slots[rank_] = data;
  hub_->barrier(lock);
  lock.unlock();
  for (int r = 0; r < P; ++r) {
    const T* src = static_cast<const T*>(hub_->slots[r]) + mine.first;
    for (size_t i = 0; i < mine.size; ++i) sum[i] += src[i];
  }
  lock.lock();
  hub_->barrier(lock);  // every input read
  lock.unlock();
  if (mine.size) std::memcpy(data + mine.first, sum.data(), mine.size * sizeof(T));
  lock.lock();
  hub_->barrier(lock);  // every sum in place
  lock.unlock();
  for (int r = 0; r < P; ++r) {
    if (r == rank_) continue;
    const chunk_range c = chunk_of(count, P, r);
    if (c.size) std::memcpy(data + c.first, static_cast<const T*>(hub_->slots[r]) + c.first, c.size * sizeof(T));
  }
  lock.lock();
  hub_->barrier(lock);  // every sum copied
}

void LocalComm::allreduce_sum_host(double* data, size_t count) { allreduce(data, count); }

void LocalComm::allreduce_sum(float* data, size_t count) {
  // Backend memory: every rank stages its input on the host, the host sum runs as for
  // host data (rank order, the same bits), and the result goes back.
  std::vector<float> host(count);
  hub_->memory.copy(host.data(), data, count * sizeof(float));
  allreduce(host.data(), count);
  hub_->memory.copy(data, host.data(), count * sizeof(float));
}

void LocalComm::start_exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) {
  // Messages are staged on the host outside the lock: device copies do not hold up peers.
  std::vector<std::vector<float>> staged(sends.size());
  for (size_t i = 0; i < sends.size(); ++i) {
    staged[i].resize(sends[i].count);
    hub_->memory.copy(staged[i].data(), sends[i].data, sends[i].count * sizeof(float));
  }
  std::unique_lock<std::mutex> lock(hub_->mu);
  hub_->check();
  for (size_t i = 0; i < sends.size(); ++i) hub_->mail[{rank_, sends[i].peer}].push_back(std::move(staged[i]));
  if (!sends.empty()) hub_->cv.notify_all();
  pending_ = recvs;
}

void LocalComm::finish_exchange() {
  const std::vector<RecvMsg> recvs = std::move(pending_);
  pending_.clear();
  std::unique_lock<std::mutex> lock(hub_->mu);
  for (const RecvMsg& r : recvs) {
    auto& box = hub_->mail[{r.peer, rank_}];
    hub_->cv.wait(lock, [&] { return !box.empty() || hub_->aborted; });
    hub_->check();
    std::vector<float> msg = std::move(box.front());
    box.pop_front();
    if (msg.size() != r.count)
      throw std::logic_error(fmt::format("halo message from rank {} to {} has {} floats, expected {}",
                                         r.peer, rank_, msg.size(), r.count));
    lock.unlock();
    hub_->memory.copy(r.data, msg.data(), r.count * sizeof(float));
    lock.lock();
  }
}

void LocalComm::broadcast_host(void* data, size_t bytes, int root) {
  std::unique_lock<std::mutex> lock(hub_->mu);
  hub_->slots[rank_] = data;
  hub_->barrier(lock);
  if (rank_ != root) std::memcpy(data, hub_->slots[root], bytes);
  hub_->barrier(lock);
}

void LocalComm::barrier() {
  std::unique_lock<std::mutex> lock(hub_->mu);
  hub_->barrier(lock);
}

std::unique_ptr<Comm> LocalComm::split(int color) {
  std::unique_lock<std::mutex> lock(hub_->mu);
  hub_->colors[rank_] = color;
  // Every rank enters this barrier at the same generation: a unique id for this split.
  const uint64_t id = hub_->generation;
  hub_->barrier(lock);
  int new_rank = 0, new_size = 0;
  for (int r = 0; r < hub_->size; ++r)
    if (hub_->colors[r] == color) {
      if (r < rank_) ++new_rank;
      ++new_size;
    }
  auto& child = hub_->children[{id, color}];
  if (!child) {
    child = std::make_shared<LocalHub>(new_size, hub_->memory);
    hub_->all_children.push_back(child);
  }
  auto comm = std::make_unique<LocalComm>(child, new_rank);
  hub_->barrier(lock);
  return comm;
}

void LocalComm::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(hub_->mu);
  hub_->abort_all(why);
}

}  // namespace ht
