// Halo exchange for one layer and one rank, driven only by the ShardPlan: forward gathers
// the rows/cols a windowed layer reads from its neighbours; backward is the adjoint,
// sending the gradient of every received cell back to its owner and adding it there.
// The row phase's messages are in flight while the copy that sharding needs anyway runs
// (x into the extended tensor; the owned part of the extended gradient out of it).
#pragma once

#include "orchestrator/shard_plan.hpp"
#include "worker/comm/comm.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

class HaloExchange {
 public:
  HaloExchange(const ShardPlan& plan, int layer, int rank, Comm& world, ComputeBackend& backend);

  const Rect& owned() const { return owned_; }
  const Rect& needed() const { return needed_; }
  // True when this rank reads exactly what it owns: it receives nothing and needs no
  // extended copy, though its neighbours may still read from it.
  bool in_place() const { return owned_ == needed_; }

  // x: [n, c, owned rows, owned cols] -> [n, c, needed rows, needed cols].
  Tensor gather(const Tensor& x, const std::string& what);
  // grad of the extended input -> grad of the owned input (received cells added to owners).
  Tensor scatter_add(const Tensor& grad_ext, const std::string& what);
  // The same, accumulating in grad_ext's own memory instead of a copy of it.
  Tensor scatter_add(Tensor&& grad_ext, const std::string& what);
  // The same without a copy, when in_place(): sends x's border to the neighbours that read
  // it; adds their gradients of it into grad.
  void gather_in_place(const Tensor& x);
  void scatter_add_in_place(Tensor& grad);

 private:
  // Forward sends the owned border and writes what arrives into the halo; backward, the
  // adjoint, sends the halo's gradients back and adds them into the owned border.
  enum class Direction { Forward, Backward };
  void run_phase(HaloPhase phase, Tensor& ext, Direction direction);
  // run_phase in two halves around other work: start_phase packs from `from` (whose cell
  // (0, 0) is image cell from_frame.lo) and posts; finish_phase waits and unpacks into
  // `into`, framed the same way. The buffers live in between.
  void start_phase(HaloPhase phase, const Tensor& from, const Rect& from_frame, Direction direction);
  void finish_phase(Tensor& into, const Rect& into_frame);

  struct Pending {
    Tensor send_buf, recv_buf;
    std::vector<HaloRegion> to_unpack;
    Direction direction = Direction::Forward;
    bool active = false;
  };

  const ShardPlan& plan_;
  int layer_, rank_;
  Comm& world_;
  ComputeBackend& backend_;
  Rect owned_, needed_;
  Pending pending_;  // the phase started and not yet finished
};

}  // namespace ht
