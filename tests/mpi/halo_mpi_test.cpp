// The halo-exchange invariants over MPI: run as `mpirun -np P halo_mpi_test ROWS COLS H W`.
// Prints "N passed, M failed" on rank 0; exit 1 on any failure.
#include <mpi.h>

#include <cstdio>

#include "common/halo_checks.hpp"
#include "worker/comm/mpi_comm.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = 0, passed = 0;
  {
    ht::MpiComm comm(MPI_COMM_WORLD, false);
    if (argc != 5) {
      std::fprintf(stderr, "usage: halo_mpi_test ROWS COLS H W\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const ht::GridShape grid{std::atoi(argv[1]), std::atoi(argv[2])};
    const ht::ShardPlan plan = ht::make_shard_plan(ht::testing::halo_model(std::atoi(argv[3]), std::atoi(argv[4])),
                                                   grid, comm.size());
    auto backend = ht::make_backend({});
    for (int l = 0; l < int(plan.model.layers.size()); ++l) {
      std::string error = ht::testing::check_gather_indices(plan, l, comm.rank(), comm, *backend);
      double bad = error.empty() ? 0 : 1;
      if (!error.empty()) std::fprintf(stderr, "rank %d: %s\n", comm.rank(), error.c_str());
      comm.allreduce_sum_host(&bad, 1);
      (bad > 0 ? failed : passed)++;
      const double gap = ht::testing::adjoint_gap(plan, l, comm.rank(), comm, *backend);
      if (gap > 1e-6 && comm.rank() == 0) std::fprintf(stderr, "layer %d: adjoint gap %g\n", l, gap);
      (gap > 1e-6 ? failed : passed)++;
    }
    if (comm.rank() == 0) std::printf("%d passed, %d failed\n", passed, failed);
  }
  MPI_Finalize();
  return failed ? 1 : 0;
}
