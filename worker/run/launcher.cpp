#include "worker/run/launcher.hpp"

#include <mpi.h>
#include <omp.h>

#include <filesystem>
#include <thread>

#include "kernels/cpu/threads.hpp"
#include "orchestrator/conv_geometry.hpp"
#include "orchestrator/files.hpp"
#include "worker/comm/local_comm.hpp"
#include "worker/comm/mpi_comm.hpp"
#include "worker/io/manifest.hpp"
#include "worker/io/synthetic_data.hpp"
#include "worker/layers/layers.hpp"
#include "worker/run/batch.hpp"
#include "worker/runtime/log.hpp"

namespace ht {

namespace {

// Makes data.train (and data.validation, from other images) from data.synthesize when they
// do not exist yet.
void make_synthetic_data(const Config& config) {
  if (!config.data.synthesize) return;
  const SynthesizeConfig& s = *config.data.synthesize;
  auto make = [&](const std::string& path, const char* key, SyntheticOptions o) {
    if (path.empty() || std::filesystem::exists(path)) return;
    if (is_manifest(path))
      throw ConfigError(fmt::format("{}: {} {} does not exist, and data.synthesize writes HDF5 files, not manifests: "
                                    "give {} a .h5 name, or remove data.synthesize",
                                    config.source_path, key, path, key));
    log().info("writing synthetic data {} ({} x {} x {} x {})", path, o.count, s.height, s.width, s.channels);
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty())
      if (const std::string problem = writable_directory_problem(parent.string()); !problem.empty())
        throw ConfigError(fmt::format("{}: {} {} cannot be made from data.synthesize: its directory {} {}",
                                      config.source_path, key, path, parent.string(), problem));
    write_synthetic_dataset(path, o);
  };
  const SyntheticOptions train = synthetic_options(config);
  make(config.data.train, "data.train", train);
  SyntheticOptions validation = train;
  validation.count = s.validation_count > 0 ? s.validation_count : std::max(1, s.count / 4);
  validation.seed = train.seed ^ 0x76616c6964ull;  // other images than the training ones
  make(config.data.validation, "data.validation", validation);
}

void check_batch(const Config& config, const ShardPlan& plan) {
  const TrainingConfig& t = config.training;
  if (t.batch_size % (plan.groups * t.accumulate) != 0)
    throw ConfigError(fmt::format(
        "{}: training.batch_size {} must be divisible by the {} sample groups ({} ranks / grid {}x{}){}",
        config.source_path, t.batch_size, plan.groups, plan.world(), plan.grid_rows, plan.grid_cols,
        t.accumulate > 1 ? fmt::format(" times training.accumulate {}", t.accumulate) : ""));
}

// `device_slot`: this worker's index among the workers of its node; picks the local GPU.
BackendOptions backend_options(const Config& config, int rank, int device_slot, int threads) {
  BackendOptions o;
  o.kind = config.parallel.backend;
  o.device_index = device_slot % std::max(1, config.parallel.devices_per_node);
  o.memory_budget = config.parallel.device_memory;
  o.threads = threads;
  o.name = fmt::format("rank {} {}", rank, to_string(config.parallel.backend));
  return o;
}

// This rank's index among the ranks of its node, from MPI itself: SLURM_LOCALID is also
// set (to 0) for the batch step that runs mpirun, so the environment can mislead.
int node_local_rank() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int rank = 0;
  const int status = MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  MPI_CHECK(status);
  return rank;
}

// The comm over all ranks for a worker on `backend`: under MPI with backend cuda an
// NcclComm on its GPU (halos and gradients stay on the device); none otherwise, so the
// worker keeps the MPI comm (host memory) it was given.
std::unique_ptr<Comm> make_world_comm(const Config& config, ComputeBackend& backend) {
  if (config.parallel.backend != Backend::CUDA) return nullptr;
  return make_nccl_world_comm(backend);
}

void run_mpi(const Config& config, const ShardPlan& plan, const WorkerBody& body) {
  MpiComm world(MPI_COMM_WORLD, false);
  set_log_rank(world.rank(), world.size());
  const int threads = threads_per_rank(config, 1);
  // GPUs are per node; the CPU backend has no device to pick.
  const int slot = config.parallel.backend == Backend::CUDA ? node_local_rank() : world.rank();
  body(world.rank(), world, backend_options(config, world.rank(), slot, threads),
       [&config](ComputeBackend& backend) { return make_world_comm(config, backend); });
}

void run_local(const Config& config, const ShardPlan& plan, const WorkerBody& body) {
  const int world = plan.world();
  const int threads = threads_per_rank(config, world);
  // libgomp binds each shard's team to the same first places: the shards then share cores.
  if (world > 1 && (std::getenv("OMP_PROC_BIND") || std::getenv("OMP_PLACES")))
    log().warn("OMP_PROC_BIND/OMP_PLACES is set: the {} shards of this process would bind their threads to "
               "the same cores; unset it, or run one rank per shard under mpirun with --bind-to",
               world);
  // Backend memory crosses threads through the host: a CUDA halo goes device -> host -> device.
  auto comms = LocalComm::create(world, memory_ops(config.parallel.backend));
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> workers;
  for (int r = 0; r < world; ++r) {
    workers.emplace_back([&, r] {
      set_log_rank(r, world);
      try {
        body(r, *comms[r], backend_options(config, r, r, threads), {});
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        comms[r]->abort(e.what());
      }
    });
  }
  for (auto& t : workers) t.join();
  // Report the failure that started it, not the aborts it caused in the other shards.
  std::exception_ptr first;
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommAborted&) {
      if (!first) first = e;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

int mpi_world_size() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int world_size = 1;
  if (initialized) MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  return world_size;
}

ShardPlan launch_shards(const Config& config, const ModelSpec& model) {
  const int world_size = mpi_world_size();
  const GridShape grid = plan_grid(config, model);
  if (world_size > 1 && world_size % (grid.rows * grid.cols) != 0)
    throw ConfigError(fmt::format(
        "{}: parallel.grid [{}, {}] needs a multiple of {} ranks; this job has {}", config.source_path,
        grid.rows, grid.cols, grid.rows * grid.cols, world_size));
  const ShardPlan plan =
      world_size > 1 ? make_shard_plan(model, grid, world_size) : make_shard_plan(model, grid);
  check_batch(config, plan);
  return plan;
}

// A plan whose predicted peak passes parallel.device_memory is refused before any step
// runs, with plan's message (the need, the budget, the smallest grid that fits).
Plan launch_plan(const Config& config, const ModelSpec& model) {
  check_layer_kernels(model);
  Plan plan = make_plan(config, launch_shards(config, model));
  if (!plan.fits()) throw ConfigError(plan.verdict);
  plan.decodes = data_whole_decodes(config, model);
  check_whole_decodes(config, plan.shards, plan.decodes);
  return plan;
}

void check_whole_decodes(const Config& config, const ShardPlan& plan, const WholeDecodes& decodes) {
  // Every rank on this machine keeps its own.
  const int here = cpu::workers_on_node(mpi_world_size() > 1 ? 1 : plan.world());
  const uint64_t need = saturating_product({decodes.per_rank, uint64_t(here)});
  if (need > physical_memory_bytes())
    throw ConfigError(fmt::format("{}: {} of the image files cannot be streamed and are decoded whole, {} for the {} "
                                  "rank{} on this machine, more than this machine's {} (the largest: {}); convert "
                                  "them to tiled TIFF, or to HDF5 with halotrain convert-data",
                                  config.source_path, decodes.images, format_size(need), here, here == 1 ? "" : "s",
                                  format_size(physical_memory_bytes()), decodes.largest));
}

void ensure_data(const Config& config) {
  if (mpi_world_size() == 1) {
    make_synthetic_data(config);
    return;
  }
  MpiComm world(MPI_COMM_WORLD, false);
  if (world.rank() == 0) make_synthetic_data(config);
  world.barrier();
}

void run_workers(const Config& config, const ShardPlan& plan, const WorkerBody& body) {
  const int in_process = mpi_world_size() > 1 ? 1 : plan.world();
  if (config.parallel.threads > 0 &&
      int64_t(config.parallel.threads) * in_process > int64_t(cpu::usable_cpus()))
    log().warn("parallel.threads {} for each of the {} rank{} here is more than the {} CPUs they may use: the "
               "threads will share cores",
               config.parallel.threads, in_process, in_process == 1 ? "" : "s", cpu::usable_cpus());
  if (mpi_world_size() > 1) return run_mpi(config, plan, body);
  run_local(config, plan, body);
}

}  // namespace ht
