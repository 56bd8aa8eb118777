// Starts the workers of a job (train, evaluate, predict): one MPI rank each under
// mpirun/srun, or every shard as a thread of this process (the embedded default).
#pragma once

#include <functional>
#include <memory>

#include "orchestrator/plan.hpp"
#include "orchestrator/shard_plan.hpp"
#include "worker/comm/comm.hpp"
#include "worker/runtime/backend.hpp"

namespace ht {

// Makes the comm over all ranks that lives on a backend's device (NCCL); called after the
// backend is created, and again after each recycle. Without a factory, or when it returns
// null, a worker uses the comm it was given (MPI, local threads) as is.
using DeviceWorldFactory = std::function<std::unique_ptr<Comm>(ComputeBackend& backend)>;

// One worker's part of a job: its rank, the comm over all ranks, its backend's options and
// the device comm factory (backend cuda under MPI).
using WorkerBody =
    std::function<void(int rank, Comm& world, const BackendOptions& backend, const DeviceWorldFactory& device_world)>;

// The shard plan of this launch: the config's grid (or `auto`) over MPI's ranks, or over
// the threads of one process. Checks that the batch divides among the sample groups and
// their micro-batches.
ShardPlan launch_shards(const Config& config, const ModelSpec& model);
// The training plan of this launch (make_plan of launch_shards); ConfigError with its
// verdict when it does not fit.
Plan launch_plan(const Config& config, const ModelSpec& model);
// ConfigError when the image files decoded whole (`decodes`, per rank) would need more
// memory than this machine has for the ranks of `plan` it runs.
void check_whole_decodes(const Config& config, const ShardPlan& plan, const WholeDecodes& decodes);

// Makes data.train and data.validation from data.synthesize when they do not exist
// (rank 0 under MPI, the others wait).
void ensure_data(const Config& config);

// Runs `body` on every worker of `plan` and returns when all are done; the failure that
// started a failed job is rethrown, not the aborts it caused in the other workers.
void run_workers(const Config& config, const ShardPlan& plan, const WorkerBody& body);

// The ranks of MPI_COMM_WORLD; 1 outside MPI.
int mpi_world_size();

}  // namespace ht
