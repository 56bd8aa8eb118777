// The instruction set oneDNN dispatches to: a plan input (`parallel.cpu_isa`), because its
// convolutions' scratchpads and blocked layouts (and so the memory model's conv scratch)
// follow it. oneDNN takes a cap once per process, before its first kernel.
#pragma once

#include <string>
#include <vector>

namespace ht::cpu {

// The names `parallel.cpu_isa` takes besides "auto", oldest first (oneDNN's cpu_isa).
const std::vector<std::string>& dnnl_isa_names();

// Caps oneDNN at `name` ("auto": no cap beyond ONEDNN_MAX_CPU_ISA and the CPU) and returns
// the ISA it then dispatches to, by name. The first call of a process decides; a later call
// with the same name returns the same, one with another throws std::logic_error.
std::string use_dnnl_isa(const std::string& name);

// Whether the ISA oneDNN dispatches to reaches `name` (one of dnnl_isa_names()). The
// hand-written vector kernels that change what a plan counts (conv_small.hpp) follow it, so
// a cap (`parallel.cpu_isa`, ONEDNN_MAX_CPU_ISA) holds for them too and a capped plan is the
// same on any CPU that has the cap's ISA. Decides oneDNN's ISA as use_dnnl_isa("auto")
// would where nothing did yet.
bool dnnl_isa_reaches(const std::string& name);

}  // namespace ht::cpu
