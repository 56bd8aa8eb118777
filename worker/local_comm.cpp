#include "worker/local_comm.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

namespace ht {

struct LocalHub {
  explicit LocalHub(int n) : size(n), slots(n), colors(n) {}
  const int size;
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

std::vector<std::unique_ptr<Comm>> LocalComm::create(int size) {
  auto hub = std::make_shared<LocalHub>(size);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<LocalComm>(hub, r));
  return comms;
}

LocalComm::LocalComm(std::shared_ptr<LocalHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
LocalComm::~LocalComm() = default;

int LocalComm::size() const { return hub_->size; }

template <class T>
void LocalComm::allreduce(T* data, size_t count) {
  // Every rank sums all inputs in rank order into a private result, so the sum is the same
  // on every rank and independent of arrival order; the second barrier keeps inputs alive
  // until everyone has read them.
  std::vector<T> result(count, T(0));
  std::unique_lock<std::mutex> lock(hub_->mu);
  hub_->slots[rank_] = data;
  hub_->barrier(lock);
  for (int r = 0; r < hub_->size; ++r) {
    const T* src = static_cast<const T*>(hub_->slots[r]);
    for (size_t i = 0; i < count; ++i) result[i] += src[i];
  }
  hub_->barrier(lock);
  std::memcpy(data, result.data(), count * sizeof(T));
}

void LocalComm::allreduce_sum_host(double* data, size_t count) { allreduce(data, count); }
void LocalComm::allreduce_sum(float* data, size_t count) { allreduce(data, count); }

void LocalComm::exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) {
  std::unique_lock<std::mutex> lock(hub_->mu);
  hub_->check();
  for (const SendMsg& s : sends)
    hub_->mail[{rank_, s.peer}].emplace_back(s.data, s.data + s.count);
  if (!sends.empty()) hub_->cv.notify_all();
  for (const RecvMsg& r : recvs) {
    auto& box = hub_->mail[{r.peer, rank_}];
    hub_->cv.wait(lock, [&] { return !box.empty() || hub_->aborted; });
    hub_->check();
    std::vector<float>& msg = box.front();
    if (msg.size() != r.count)
      throw std::logic_error(fmt::format("halo message from rank {} to {} has {} floats, expected {}",
                                         r.peer, rank_, msg.size(), r.count));
    std::memcpy(r.data, msg.data(), r.count * sizeof(float));
    box.pop_front();
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
    child = std::make_shared<LocalHub>(new_size);
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
