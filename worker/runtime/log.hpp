// Logging through spdlog, every line tagged [rank/world]. Shards that run as threads of one
// process each tag their own lines.
#pragma once

#include <spdlog/spdlog.h>

namespace ht {

// Sets the calling thread's tag; before it is called the tag comes from SLURM_PROCID /
// OMPI_COMM_WORLD_RANK (read before MPI starts), else [0/1].
void set_log_rank(int rank, int world);
spdlog::logger& log();

}  // namespace ht
