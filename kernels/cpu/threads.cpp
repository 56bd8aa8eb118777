#include "kernels/cpu/threads.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace ht::cpu {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end && *end == '\0' && n > 0 ? int(n) : fallback;
}

}  // namespace

int usable_cpus() {
  // libgomp has already bound this thread to the first place, so the mask would say 1.
  if (omp_get_proc_bind() != omp_proc_bind_false && omp_get_num_places() > 0) {
    int n = 0;
    for (int p = 0; p < omp_get_num_places(); ++p) n += omp_get_place_num_procs(p);
    return std::max(1, n);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1, omp_get_num_procs());
  return std::max(1, CPU_COUNT(&set));
}

int workers_on_node(int in_process) {
  if (env_int("OMPI_COMM_WORLD_SIZE", 1) > 1) return env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  if (env_int("SLURM_NTASKS", 1) > 1 && std::getenv("SLURM_STEP_ID"))
    return env_int("SLURM_NTASKS_PER_NODE", 1);
  return std::max(1, in_process);
}

int worker_threads(int workers) {
  const int usable = usable_cpus();
  if (const int t = env_int("OMP_NUM_THREADS", 0); t > 0) return std::min(t, usable);
  return std::clamp(int(std::thread::hardware_concurrency()) / std::max(1, workers), 1, usable);
}

}  // namespace ht::cpu
