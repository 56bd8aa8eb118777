// How many OpenMP threads a CPU worker runs. The launcher starts workers with this count
// and the memory model sizes oneDNN's scratchpads with it (they grow with the threads),
// so both must ask the same question here.
#pragma once

namespace ht::cpu {

// CPUs this process may run on: the affinity mask (taskset, Slurm --cpus-per-task, mpirun
// --bind-to), or, when OpenMP binds threads, the CPUs of its places.
int usable_cpus();

// Workers of one job sharing this machine's CPUs: the ranks on this node when the job runs
// under mpirun or srun (OMPI_COMM_WORLD_LOCAL_SIZE, else SLURM_NTASKS_PER_NODE), else the
// `in_process` shard threads of this one process.
int workers_on_node(int in_process);

// The threads of each of `workers` workers: OMP_NUM_THREADS when it is set, else the
// machine's CPUs divided among them, at least 1 and at most the usable CPUs.
int worker_threads(int workers);

}  // namespace ht::cpu
