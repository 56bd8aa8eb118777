// Halo exchange for one layer and one rank, driven only by the ShardPlan: forward gathers
// the rows/cols a windowed layer reads from its neighbours; backward is the adjoint,
// sending the gradient of every received cell back to its owner and adding it there.
#pragma once

#include "orchestrator/shard_plan.hpp"
#include "worker/backend.hpp"
#include "worker/comm.hpp"

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
  // gather() in two halves: start_gather returns the extended tensor with x's cells in
  // place and the row halo posted; finish_gather receives it, then runs the column phase.
  // Between them the caller may compute whatever reads only x's own cells.
  Tensor start_gather(const Tensor& x, const std::string& what);
  void finish_gather(Tensor& ext);
  // True when the column phase receives nothing: after start_gather, every cell of the
  // owned rows that a window can read is in place.
  bool owned_rows_complete() const { return needed_.cols == owned_.cols; }
  // True when the column phase moves nothing to or from this rank: the backward's column
  // phase then leaves the owned cells alone too.
  bool no_column_phase() const;
  // grad of the extended input -> grad of the owned input (received cells added to owners).
  Tensor scatter_add(const Tensor& grad_ext, const std::string& what);
  // The same, accumulating in grad_ext's own memory instead of a copy of it.
  Tensor scatter_add(Tensor&& grad_ext, const std::string& what);
  // scatter_add(Tensor&&) in two halves: start_scatter runs the column phase and posts the
  // row halo's gradients (grad_ext's rows outside the owned rows, which must be final);
  // finish_scatter adds what the neighbours send into the owned border rows and returns
  // the owned gradient. Between them the caller may finish the owned rows of grad_ext.
  void start_scatter(Tensor& grad_ext);
  Tensor finish_scatter(Tensor&& grad_ext, const std::string& what);
  // The same without a copy, when in_place(): sends x's border to the neighbours that read
  // it; adds their gradients of it into grad.
  void gather_in_place(const Tensor& x);
  void scatter_add_in_place(Tensor& grad);

 private:
  // Forward sends the owned border and writes what arrives into the halo; backward, the
  // adjoint, sends the halo's gradients back and adds them into the owned border.
  enum class Direction { Forward, Backward };
  void run_phase(HaloPhase phase, Tensor& ext, Direction direction);
  // run_phase in two halves: packs and posts; then waits and unpacks into the same `ext`.
  void start_phase(HaloPhase phase, const Tensor& ext, Direction direction);
  void finish_phase(Tensor& ext);

  // The phase started and not yet finished.
  struct Pending {
    Tensor send_buf, recv_buf;
    std::vector<HaloRegion> to_unpack;
    Direction direction = Direction::Forward;
    bool active = false;
  };
  Pending pending_;

  const ShardPlan& plan_;
  int layer_, rank_;
  Comm& world_;
  ComputeBackend& backend_;
  Rect owned_, needed_;
};

}  // namespace ht
