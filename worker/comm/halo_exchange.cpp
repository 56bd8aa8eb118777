#include "worker/comm/halo_exchange.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace ht {

HaloExchange::HaloExchange(const ShardPlan& plan, int layer, int rank, Comm& world,
                           ComputeBackend& backend)
    : plan_(plan), layer_(layer), rank_(rank), world_(world), backend_(backend) {
  owned_ = plan.owned_input(layer, rank);
  needed_ = plan.needed_input(layer, rank);
}

Tensor HaloExchange::gather(const Tensor& x, const std::string& what) {
  Tensor ext(backend_.allocator(), x.n(), x.c(), needed_.rows.size(), needed_.cols.size(), what);
  // The row halo goes out of x itself, and x's cells move into ext while it is in flight.
  start_phase(HaloPhase::Rows, x, owned_, Direction::Forward);
  backend_.unpack_rect(x.data(), x.n(), x.c(), ext.h(), ext.w(), owned_.rows.lo - needed_.rows.lo,
                       owned_.cols.lo - needed_.cols.lo, owned_.rows.size(), owned_.cols.size(),
                       ext.data(), ComputeBackend::Unpack::Overwrite);
  finish_phase(ext, needed_);
  // Rows first, then columns including the received rows: that covers the corners.
  run_phase(HaloPhase::Cols, ext, Direction::Forward);
  return ext;
}

Tensor HaloExchange::scatter_add(const Tensor& grad_ext, const std::string& what) {
  Tensor work(backend_.allocator(), grad_ext.n(), grad_ext.c(), grad_ext.h(), grad_ext.w(), what);
  backend_.copy(work.data(), grad_ext.data(), grad_ext.size());
  return scatter_add(std::move(work), what);
}

Tensor HaloExchange::scatter_add(Tensor&& grad_ext, const std::string& what) {
  // The adjoint runs the phases in reverse, accumulating into the extended gradient; the
  // row phase's gradients arrive into dx, after the owned part is copied out beside them.
  Tensor work = std::move(grad_ext);
  run_phase(HaloPhase::Cols, work, Direction::Backward);
  start_phase(HaloPhase::Rows, work, needed_, Direction::Backward);
  Tensor dx(backend_.allocator(), work.n(), work.c(), owned_.rows.size(), owned_.cols.size(), what);
  backend_.pack_rect(work.data(), work.n(), work.c(), work.h(), work.w(),
                     owned_.rows.lo - needed_.rows.lo, owned_.cols.lo - needed_.cols.lo,
                     owned_.rows.size(), owned_.cols.size(), dx.data());
  finish_phase(dx, owned_);
  return dx;
}

void HaloExchange::gather_in_place(const Tensor& x) {
  // Nothing is received (needed == owned), so the phases only read from x.
  run_phase(HaloPhase::Rows, const_cast<Tensor&>(x), Direction::Forward);
  run_phase(HaloPhase::Cols, const_cast<Tensor&>(x), Direction::Forward);
}

void HaloExchange::scatter_add_in_place(Tensor& grad) {
  run_phase(HaloPhase::Cols, grad, Direction::Backward);
  run_phase(HaloPhase::Rows, grad, Direction::Backward);
}

void HaloExchange::run_phase(HaloPhase phase, Tensor& ext, Direction direction) {
  start_phase(phase, ext, needed_, direction);
  finish_phase(ext, needed_);
}

void HaloExchange::start_phase(HaloPhase phase, const Tensor& from, const Rect& frame, Direction direction) {
  if (pending_.active) throw std::logic_error("HaloExchange: a phase started before the last one finished");
  const bool backward = direction == Direction::Backward;
  // Forward: pack what peers receive from us, unpack what we receive. Backward: the same
  // regions with the roles swapped, and unpacking adds.
  const auto incoming = plan_.receives(layer_, rank_, phase);
  const auto outgoing = plan_.sends(layer_, rank_, phase);
  const auto& to_pack = backward ? incoming : outgoing;
  const auto& to_unpack = backward ? outgoing : incoming;
  if (to_pack.empty() && to_unpack.empty()) return;
  const int n = from.n(), c = from.c();
  auto volume = [&](const HaloRegion& r) { return size_t(n) * c * size_t(r.rect.area()); };
  size_t send_total = 0, recv_total = 0;
  for (const auto& r : to_pack) send_total += volume(r);
  for (const auto& r : to_unpack) recv_total += volume(r);
  Pending& p = pending_;
  p.send_buf = Tensor(backend_.allocator(), 1, 1, 1, int(send_total), "halo send buffer");
  p.recv_buf = Tensor(backend_.allocator(), 1, 1, 1, int(recv_total), "halo receive buffer");
  p.to_unpack = to_unpack;
  p.direction = direction;
  p.active = true;

  std::vector<SendMsg> sends;
  size_t offset = 0;
  for (const auto& r : to_pack) {
    float* dst = p.send_buf.data() + offset;
    backend_.pack_rect(from.data(), n, c, from.h(), from.w(), r.rect.rows.lo - frame.rows.lo,
                       r.rect.cols.lo - frame.cols.lo, r.rect.rows.size(), r.rect.cols.size(), dst);
    sends.push_back({r.peer, dst, volume(r)});
    offset += volume(r);
  }
  std::vector<RecvMsg> recvs;
  offset = 0;
  for (const auto& r : to_unpack) {
    recvs.push_back({r.peer, p.recv_buf.data() + offset, volume(r)});
    offset += volume(r);
  }
  backend_.synchronize();
  world_.start_exchange(sends, recvs);
}

void HaloExchange::finish_phase(Tensor& into, const Rect& frame) {
  Pending& p = pending_;
  if (!p.active) return;
  p.active = false;
  world_.finish_exchange();
  const int n = into.n(), c = into.c();
  size_t offset = 0;
  for (const auto& r : p.to_unpack) {
    backend_.unpack_rect(p.recv_buf.data() + offset, n, c, into.h(), into.w(), r.rect.rows.lo - frame.rows.lo,
                         r.rect.cols.lo - frame.cols.lo, r.rect.rows.size(), r.rect.cols.size(), into.data(),
                         p.direction == Direction::Backward ? ComputeBackend::Unpack::Accumulate
                                                            : ComputeBackend::Unpack::Overwrite);
    offset += size_t(n) * c * size_t(r.rect.area());
  }
  p.recv_buf.release();
  p.send_buf.release();
}

}  // namespace ht
