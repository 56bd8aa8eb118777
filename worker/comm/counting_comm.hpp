// A Comm that forwards to another and counts the bytes this rank sends to each peer in
// point-to-point exchanges (the halos). The trainer compares them with the plan's halo
// traffic, split by whether the peer runs on the same host.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/comm/comm.hpp"

namespace ht {

class CountingComm : public Comm {
 public:
  // Adds to `sent` (one entry per rank of `inner`), which outlives this comm.
  CountingComm(Comm& inner, std::vector<uint64_t>& sent) : inner_(inner), sent_(sent) {
    sent_.resize(size_t(inner.size()), 0);
  }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void allreduce_sum_host(double* data, size_t count) override { inner_.allreduce_sum_host(data, count); }
  void allreduce_sum(float* data, size_t count) override { inner_.allreduce_sum(data, count); }
  void start_exchange(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) override {
    if (counting_)
      for (const SendMsg& m : sends) sent_[size_t(m.peer)] += m.count * sizeof(float);
    inner_.start_exchange(sends, recvs);
  }
  void finish_exchange() override { inner_.finish_exchange(); }
  void broadcast_host(void* data, size_t bytes, int root) override { inner_.broadcast_host(data, bytes, root); }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<Comm> split(int color) override { return inner_.split(color); }
  void abort(const std::string& why) override { inner_.abort(why); }

  void set_counting(bool on) { counting_ = on; }

 private:
  Comm& inner_;
  std::vector<uint64_t>& sent_;
  bool counting_ = true;
};

}  // namespace ht
