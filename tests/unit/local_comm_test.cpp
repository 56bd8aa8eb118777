// The threads comm moves backend memory only through its MemoryOps (CUDA: cudaMemcpy), in
// exchange() and allreduce_sum(), also in comms made by split(); sums stay in rank order;
// an exchange started returns before its peer has posted.
// Host memory stands in for the device here: the copy function counts its calls.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/local_comm.hpp"

namespace ht {
namespace {

std::atomic<size_t> g_copied_bytes{0};

void counting_copy(void* dst, const void* src, size_t bytes) {
  g_copied_bytes += bytes;
  std::memcpy(dst, src, bytes);
}

template <class Body>
void on_every_rank(std::vector<std::unique_ptr<Comm>>& comms, Body body) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(comms.size());
  for (int r = 0; r < int(comms.size()); ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, *comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        comms[r]->abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (size_t r = 0; r < comms.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

MemoryOps counting_ops() {
  MemoryOps ops;
  ops.copy = &counting_copy;
  return ops;
}

float value(int rank, size_t i) { return 0.1f * float(rank + 1) + 1e-7f * float(i) * float(rank * 3 + 1); }

TEST(LocalCommMemoryOps, AllreduceStagesThroughTheCopyAndSumsInRankOrder) {
  g_copied_bytes = 0;
  const int P = 3;
  const size_t n = 1001;
  auto comms = LocalComm::create(P, counting_ops());
  std::vector<std::vector<float>> data(P);
  on_every_rank(comms, [&](int r, Comm& comm) {
    data[r].resize(n);
    for (size_t i = 0; i < n; ++i) data[r][i] = value(r, i);
    comm.allreduce_sum(data[r].data(), n);
  });
  for (size_t i = 0; i < n; ++i) {
    float want = 0.f;
    for (int r = 0; r < P; ++r) want += value(r, i);
    for (int r = 0; r < P; ++r) ASSERT_EQ(data[r][i], want) << "rank " << r << " element " << i;
  }
  EXPECT_EQ(g_copied_bytes.load(), size_t(P) * 2 * n * sizeof(float));  // in and out, per rank
}

// The reduce-scatter's chunks: fewer elements than ranks (empty chunks), counts that do
// not divide, and many repeats of the collective back to back.
TEST(LocalCommAllreduce, ChunksOfAnySizeGiveTheRankOrderedSum) {
  for (const size_t n : {size_t(1), size_t(2), size_t(5), size_t(97)}) {
    const int P = 4;
    auto comms = LocalComm::create(P);
    std::vector<std::vector<double>> data(P);
    on_every_rank(comms, [&](int r, Comm& comm) {
      for (int repeat = 0; repeat < 20; ++repeat) {
        data[r].assign(n, 0.0);
        for (size_t i = 0; i < n; ++i) data[r][i] = double(value(r, i + size_t(repeat)));
        comm.allreduce_sum_host(data[r].data(), n);
        for (size_t i = 0; i < n; ++i) {
          double want = 0.0;
          for (int k = 0; k < P; ++k) want += double(value(k, i + size_t(repeat)));
          if (data[r][i] != want) throw std::runtime_error("element " + std::to_string(i) + " of " + std::to_string(n));
        }
      }
    });
  }
  EXPECT_EQ(chunk_of(10, 4, 0).size + chunk_of(10, 4, 1).size + chunk_of(10, 4, 2).size + chunk_of(10, 4, 3).size,
            10u);
  EXPECT_EQ(chunk_of(2, 4, 0).size, 0u);
  EXPECT_EQ(chunk_of(2, 4, 3).first, 1u);
}

TEST(LocalCommMemoryOps, ExchangeCopiesOutOfTheSenderAndIntoTheReceiver) {
  g_copied_bytes = 0;
  const int P = 4;
  auto comms = LocalComm::create(P, counting_ops());
  std::vector<std::vector<float>> got(P);
  on_every_rank(comms, [&](int r, Comm& comm) {
    // A ring, two messages to the next rank (matched in order), one from the previous.
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    std::vector<float> a(5, float(r)), b(3, float(10 * r));
    got[r].assign(8, -1.f);
    comm.exchange({{next, a.data(), a.size()}, {next, b.data(), b.size()}},
                  {{prev, got[r].data(), 5}, {prev, got[r].data() + 5, 3}});
  });
  for (int r = 0; r < P; ++r) {
    const float prev = float((r + P - 1) % P);
    EXPECT_EQ(got[r], (std::vector<float>{prev, prev, prev, prev, prev, 10 * prev, 10 * prev, 10 * prev}));
  }
  EXPECT_EQ(g_copied_bytes.load(), size_t(P) * 2 * 8 * sizeof(float));  // out of a, b; into got
}

// start_exchange posts and returns without waiting for the peer (a sharded conv computes
// its interior meanwhile); finish_exchange delivers. Rank 1 posts only once rank 0's start
// has returned: a start that waited for its receives would not return before then.
TEST(LocalCommMemoryOps, StartedExchangeReturnsBeforeThePeerPostsAndFinishDelivers) {
  auto comms = LocalComm::create(2);
  std::atomic<bool> started0{false};
  bool rank1_saw_start = false;
  std::vector<std::vector<float>> got(2, std::vector<float>(4, -1.f));
  on_every_rank(comms, [&](int r, Comm& comm) {
    std::vector<float> mine(4, float(r + 1));
    if (r == 1) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!started0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      rank1_saw_start = started0;
    }
    comm.start_exchange({{1 - r, mine.data(), mine.size()}}, {{1 - r, got[r].data(), 4}});
    if (r == 0) started0 = true;
    comm.finish_exchange();
  });
  EXPECT_TRUE(rank1_saw_start);
  EXPECT_EQ(got[0], std::vector<float>(4, 2.f));
  EXPECT_EQ(got[1], std::vector<float>(4, 1.f));
}

TEST(LocalCommMemoryOps, SplitCommsKeepTheCopy) {
  g_copied_bytes = 0;
  auto comms = LocalComm::create(4, counting_ops());
  std::vector<float> sums(4);
  on_every_rank(comms, [&](int r, Comm& comm) {
    auto group = comm.split(r % 2);
    float x = float(r + 1);
    group->allreduce_sum(&x, 1);
    sums[r] = x;
  });
  EXPECT_EQ(sums, (std::vector<float>{4.f, 6.f, 4.f, 6.f}));
  EXPECT_EQ(g_copied_bytes.load(), size_t(4) * 2 * sizeof(float));
}

TEST(LocalCommMemoryOps, DefaultIsHostMemoryAndHostReductionsNeverCopy) {
  EXPECT_EQ(MemoryOps{}.copy, &host_memory_copy);
  EXPECT_EQ(memory_ops(Backend::CPU).copy, &host_memory_copy);
  g_copied_bytes = 0;
  auto comms = LocalComm::create(2, counting_ops());
  on_every_rank(comms, [&](int r, Comm& comm) {
    double d = r + 0.5;
    comm.allreduce_sum_host(&d, 1);
    EXPECT_EQ(d, 2.0);
  });
  EXPECT_EQ(g_copied_bytes.load(), 0u);
}

}  // namespace
}  // namespace ht
