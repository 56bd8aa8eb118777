#include "kernels/cpu/dnnl_isa.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

namespace ht::cpu {

namespace {

const std::vector<std::pair<std::string, dnnl::cpu_isa>>& isas() {
  static const std::vector<std::pair<std::string, dnnl::cpu_isa>> table = {
      {"sse41", dnnl::cpu_isa::sse41},
      {"avx", dnnl::cpu_isa::avx},
      {"avx2", dnnl::cpu_isa::avx2},
      {"avx2_vnni", dnnl::cpu_isa::avx2_vnni},
      {"avx512_core", dnnl::cpu_isa::avx512_core},
      {"avx512_core_vnni", dnnl::cpu_isa::avx512_core_vnni},
      {"avx512_core_bf16", dnnl::cpu_isa::avx512_core_bf16},
      {"avx512_core_amx", dnnl::cpu_isa::avx512_core_amx},
  };
  return table;
}

std::string name_of(dnnl::cpu_isa isa) {
  for (const auto& [name, value] : isas())
    if (value == isa) return name;
  return "isa " + std::to_string(int(isa));
}

}  // namespace

const std::vector<std::string>& dnnl_isa_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& entry : isas()) n.push_back(entry.first);
    return n;
  }();
  return names;
}

std::string use_dnnl_isa(const std::string& name) {
  static std::mutex mutex;
  static std::optional<std::pair<std::string, std::string>> decided;  // asked for, reached
  std::lock_guard<std::mutex> lock(mutex);
  if (decided) {
    if (decided->first != name)
      throw std::logic_error("oneDNN's ISA was fixed at '" + decided->first + "' in this process; '" + name +
                             "' asked for later");
    return decided->second;
  }
  if (name != "auto") {
    bool known = false;
    for (const auto& [n, isa] : isas())
      if (n == name) {
        known = true;
        dnnl::set_max_cpu_isa(isa);  // fails only once oneDNN ran: then the check below says so
      }
    if (!known) throw std::logic_error("unknown oneDNN ISA '" + name + "'");
  }
  decided = std::make_pair(name, name_of(dnnl::get_effective_cpu_isa()));
  return decided->second;
}

bool dnnl_isa_reaches(const std::string& name) {
  // oneDNN's ISA values are nested bit sets: each includes the bits of those below it.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  for (const auto& [n, value] : isas())
    if (n == name) return (isa & static_cast<unsigned>(value)) == static_cast<unsigned>(value);
  throw std::logic_error("unknown oneDNN ISA '" + name + "'");
}

}  // namespace ht::cpu
