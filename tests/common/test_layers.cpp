// Layer kinds for tests, added through the registry alone (linked into
// halotrain_test_layers, the CLI the tests run where they need them).
//
// test_leak: the identity, whose every training forward leaks `mib` MiB of host memory held
// by the layer object, as a leaking library would: a process grows step by step, a
// recycle (the layer rebuilt, or the process restarted) gives the memory back.
#include <cstring>
#include <memory>
#include <vector>

#include "orchestrator/layer_kind.hpp"
#include "worker/layers/layers.hpp"

namespace ht {
namespace {

class LeakLayer : public Layer {
 public:
  using Layer::Layer;

 protected:
  Tensor copy_of(const Tensor& t, const std::string& what) {
    Tensor out(ctx_.backend.allocator(), t.n(), t.c(), t.h(), t.w(), what + " of " + label());
    ctx_.backend.copy(out.data(), t.data(), t.size());
    return out;
  }
  Tensor forward_impl(const Tensor& x, ForwardMode mode) override {
    if (mode == ForwardMode::Train) {
      leaked_.emplace_back(size_t(spec().config.integer("mib")) << 20);
      std::memset(leaked_.back().data(), 1, leaked_.back().size());  // resident, not just reserved
    }
    return copy_of(x, "output");
  }
  Tensor backward_impl(const Tensor&, const Tensor&, const Tensor& dy, bool need_dx) override {
    return need_dx ? copy_of(dy, "input gradient") : Tensor();
  }

 private:
  std::vector<std::vector<char>> leaked_;
};

const bool registered = [] {
  LayerKind k;
  k.type = "test_leak";
  k.keras_class = "TestLeak";
  k.keras_prefix = "test_leak";
  k.keys = {{"mib", KeyType::Int, LayerValue(int64_t(0)), "", 0, {}}};
  k.shape = [](LayerSpec& l) { l.out = l.in; };
  register_layer_kind(std::move(k));
  register_layer_kernels("test_leak", [](const LayerContext& ctx, int index) -> std::unique_ptr<Layer> {
    return std::make_unique<LeakLayer>(ctx, index);
  });
  return true;
}();

}  // namespace
}  // namespace ht
