#include "worker/runtime/log.hpp"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace ht {

namespace {

std::shared_ptr<spdlog::logger> make_logger(int rank, int world) {
  static std::shared_ptr<spdlog::sinks::stderr_color_sink_mt> sink =
      std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(fmt::format("{}/{}", rank, world), sink);
  logger->set_pattern("[%H:%M:%S] [%n] %^%l%$ %v");
  return logger;
}

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n)) return std::atoi(v);
  return fallback;
}

thread_local std::shared_ptr<spdlog::logger> tl_logger;

}  // namespace

void set_log_rank(int rank, int world) { tl_logger = make_logger(rank, world); }

spdlog::logger& log() {
  if (!tl_logger)
    tl_logger = make_logger(env_int({"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, 0),
                            env_int({"SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, 1));
  return *tl_logger;
}

}  // namespace ht
