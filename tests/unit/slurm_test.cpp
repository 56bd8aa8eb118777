// The Slurm side without a cluster: every #SBATCH line of render_sbatch from the config,
// the script body's contract (guard, launcher, exit-3 loop, requeue marker), validation
// errors, and the worker's stop handlers and `scontrol requeue` against a fake scontrol.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "orchestrator/config_io.hpp"
#include "orchestrator/process.hpp"
#include "orchestrator/slurm.hpp"
#include "orchestrator/submit.hpp"
#include "worker/run/signals.hpp"

namespace ht {
namespace {

namespace fs = std::filesystem;

const char* kConfig = R"(name: seed run
run_dir: runs/seed
data: {train: data/seed.h5}
model:
  input: [64, 48, 1]
  layers:
    - {type: conv2d, filters: 4, kernel: 3, padding: same}
    - {type: relu}
    - {type: global_avg_pool}
    - {type: dense, units: 2}
training: {batch_size: 4, steps: 100}
parallel: {backend: cuda, grid: [2, 2], devices_per_node: 2}
slurm:
  partition: k80
  nodes: 2
  time: "1-02:00:00"
  account: proj42
  signal: USR1
  signal_before: 300
  extra: ["--mem=0", "#SBATCH --constraint=k80"]
)";

Config config_with(const std::vector<std::string>& sets = {}) { return parse_config(kConfig, "test.yaml", sets); }

ShardPlan plan_for(const Config& c) {
  const int ranks = c.slurm.nodes * c.parallel.devices_per_node;
  return make_shard_plan(build_model_spec(c), {c.parallel.grid_rows, c.parallel.grid_cols}, ranks);
}

SubmitOptions options() {
  SubmitOptions o;
  o.halotrain = "/opt/halotrain/bin/halotrain";
  o.workdir = "/scratch/me/project";
  o.sets = {"parallel.grid=[2,2]", "training.steps=10"};
  return o;
}

std::string render(const Config& c, const SubmitOptions& o = options()) {
  return render_sbatch(c, plan_for(c), "/scratch/me/project/configs/seed.yaml", o);
}

std::vector<std::string> sbatch_lines(const std::string& script) {
  std::vector<std::string> out;
  std::istringstream in(script);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("#SBATCH", 0) == 0) out.push_back(line);
  return out;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(SlurmScript, EverySbatchLineComesFromTheConfig) {
  const std::vector<std::string> want = {
      "#SBATCH --job-name=\"seed run\"",
      "#SBATCH --chdir=/scratch/me/project",
      "#SBATCH --output=/scratch/me/project/runs/seed/slurm-%j.out",
      "#SBATCH --error=/scratch/me/project/runs/seed/slurm-%j.err",
      "#SBATCH --open-mode=append",
      "#SBATCH --nodes=2",
      "#SBATCH --ntasks-per-node=2",
      "#SBATCH --cpus-per-task=1",
      "#SBATCH --gres=gpu:2",
      "#SBATCH --time=1-02:00:00",
      "#SBATCH --partition=k80",
      "#SBATCH --account=proj42",
      "#SBATCH --signal=USR1@300",
      "#SBATCH --requeue",
      "#SBATCH --mem=0",
      "#SBATCH --constraint=k80",
  };
  EXPECT_EQ(sbatch_lines(render(config_with())), want);
}

TEST(SlurmScript, AllSbatchLinesPrecedeTheFirstCommand) {
  // sbatch stops reading #SBATCH at the first command.
  const std::string s = render(config_with());
  EXPECT_LT(s.rfind("\n#SBATCH"), s.find("\nset -euo pipefail"));
  EXPECT_EQ(s.rfind("#!/bin/bash", 0), 0u);
}

TEST(SlurmScript, CpuBackendTakesWholeNodesAndNoGpus) {
  const std::string s = render(config_with({"parallel.backend=cpu"}));
  EXPECT_FALSE(has(s, "--gres")) << s;
  EXPECT_FALSE(has(s, "--gpus")) << s;
  EXPECT_TRUE(has(s, "#SBATCH --exclusive\n")) << s;
  EXPECT_FALSE(has(s, "#SBATCH --cpus-per-task")) << s;
  // The node's CPUs are split among its ranks at run time.
  EXPECT_TRUE(has(s, "cpus=${SLURM_CPUS_PER_TASK:-$(( ${SLURM_CPUS_ON_NODE:-1} / ${SLURM_NTASKS_PER_NODE:-1} ))}"));
  EXPECT_TRUE(has(s, "export OMP_NUM_THREADS=$cpus"));
}

TEST(SlurmScript, CpusPerTaskOptionWinsForBothBackends) {
  SubmitOptions o = options();
  o.cpus_per_task = 6;
  for (const char* backend : {"cpu", "cuda"}) {
    const std::string s = render(config_with({std::string("parallel.backend=") + backend}), o);
    EXPECT_TRUE(has(s, "#SBATCH --cpus-per-task=6\n")) << backend;
    EXPECT_FALSE(has(s, "--exclusive")) << backend;
  }
}

TEST(SlurmScript, GpusFollowDevicesPerNode) {
  const std::string s = render(config_with({"parallel.devices_per_node=4", "slurm.nodes=1"}));
  EXPECT_TRUE(has(s, "#SBATCH --gres=gpu:4\n")) << s;
  EXPECT_TRUE(has(s, "#SBATCH --ntasks-per-node=4\n")) << s;
}

TEST(SlurmScript, AccountIsOptional) {
  const std::string s = render(config_with({"slurm.account=null"}));
  EXPECT_FALSE(has(s, "--account")) << s;
  EXPECT_TRUE(has(s, "#SBATCH --partition=k80\n")) << s;
}

TEST(SlurmScript, SignalGoesToTheRanksNotOnlyTheBatchShell) {
  const std::string s = render(config_with({"slurm.signal=SIGUSR2", "slurm.signal_before=120"}));
  EXPECT_TRUE(has(s, "#SBATCH --signal=USR2@120\n")) << s;
  EXPECT_FALSE(has(s, "B:")) << s;
  EXPECT_FALSE(has(render(config_with({"slurm.signal_before=0"})), "--signal")) << "0 s: no warning";
}

TEST(SlurmScript, ExtraLinesAreVerbatim) {
  const std::string s = render(config_with({"slurm.extra=[\"--exclude=node[01-03]\", \"#SBATCH --qos=long\"]"}));
  const auto lines = sbatch_lines(s);
  EXPECT_EQ(lines[lines.size() - 2], "#SBATCH --exclude=node[01-03]");
  EXPECT_EQ(lines.back(), "#SBATCH --qos=long");
}

TEST(SlurmScript, BodyIsForSbatchOnly) {
  const std::string s = render(config_with());
  EXPECT_TRUE(has(s, "set -euo pipefail\n"));
  EXPECT_TRUE(has(s, "if [[ -z ${SLURM_JOB_ID:-} ]]; then"));
  EXPECT_TRUE(has(s, "SLURM_JOB_ID is not set"));
  EXPECT_FALSE(has(s, "/home/")) << "no home paths";
  EXPECT_FALSE(has(s, "~/")) << "no home paths";
}

TEST(SlurmScript, LaunchesHalotrainTrainWithTheSameOverrides) {
  const std::string s = render(config_with());
  EXPECT_TRUE(has(s, "halotrain=/opt/halotrain/bin/halotrain\n")) << s;
  EXPECT_TRUE(has(s, "config=/scratch/me/project/configs/seed.yaml\n")) << s;
  EXPECT_TRUE(has(s,
                  "  srun --mpi=pmix --distribution=block --cpus-per-task=\"$cpus\" \"$halotrain\" train \"$config\" "
                  "--set 'parallel.grid=[2,2]' --set training.steps=10 || rc=$?\n"))
      << s;
  SubmitOptions o = options();
  o.launcher = "mpirun";
  o.sets = {"name=it's"};
  EXPECT_TRUE(
      has(render(config_with(), o), "  mpirun \"$halotrain\" train \"$config\" --set 'name=it'\\''s' || rc=$?"));
}

TEST(SlurmScript, ExitThreeLoopAndRequeueMarker) {
  const std::string s = render(config_with());
  // The marker the worker writes (worker/run/signals.hpp) is what the script looks for.
  EXPECT_EQ(requeue_marker_path("/scratch/me/project/runs/seed"), "/scratch/me/project/runs/seed/.requeued");
  EXPECT_TRUE(has(s, "run_dir=/scratch/me/project/runs/seed\n"));
  EXPECT_TRUE(has(s, "  rm -f \"$run_dir/.requeued\"\n"));
  EXPECT_TRUE(has(s, "  if [[ -e $run_dir/.requeued ]]; then\n"));
  EXPECT_TRUE(has(s, "relaunch_on_exit3=0"));
  EXPECT_TRUE(has(s, "if (( rc == 3 && relaunch_on_exit3 && launch < max_launches )); then"));
  const std::string r = render(config_with({"recycle.mode=restart", "recycle.every_steps=25"}));
  EXPECT_TRUE(has(r, "relaunch_on_exit3=1"));
  EXPECT_TRUE(has(r, "max_launches=6\n")) << "100 steps / 25 + 2";
}

TEST(SlurmScript, IsValidBash) {
  const fs::path file = fs::temp_directory_path() / ("slurm_test_" + std::to_string(getpid()) + ".sbatch");
  std::ofstream(file) << render(config_with());
  const CommandResult r = run_command({"bash", "-n", file.string()});
  fs::remove(file);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// submit makes parallel.threads (a plan input) and the CPUs Slurm gives each task agree.
TEST(SlurmSubmit, ThreadsAndCpusPerTaskAgree) {
  const fs::path dir = fs::temp_directory_path() / ("ht_submit_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "seed.yaml").string();
  std::ofstream(path) << kConfig;
  auto submit = [&](std::vector<std::string> sets, int cpus, std::string* err = nullptr) {
    SubmitCommand c;
    c.config_path = path;
    c.sets = std::move(sets);
    c.sets.push_back("run_dir=" + (dir / "run").string());
    c.dry_run = true;
    c.launcher = "mpirun";
    c.cpus_per_task = cpus;
    std::ostringstream out, e;
    const int rc = run_submit(c, out, e);
    if (err) *err = e.str();
    return rc == 0 ? out.str() : "exit " + std::to_string(rc);
  };
  const std::string cuda = submit({}, 0);  // auto on CUDA: one CPU a task, and the ranks are told
  EXPECT_TRUE(has(cuda, "#SBATCH --cpus-per-task=1") && has(cuda, "--set parallel.threads=1")) << cuda;
  const std::string four = submit({}, 4);
  EXPECT_TRUE(has(four, "#SBATCH --cpus-per-task=4") && has(four, "--set parallel.threads=4")) << four;
  const std::string set = submit({"parallel.threads=6"}, 0);  // a set value asks Slurm for as many
  EXPECT_TRUE(has(set, "#SBATCH --cpus-per-task=6")) << set;
  const std::string cpu = submit({"parallel.backend=cpu"}, 0);  // whole nodes: the ranks split them
  EXPECT_TRUE(has(cpu, "#SBATCH --exclusive") && !has(cpu, "parallel.threads=")) << cpu;
  std::string err;
  EXPECT_EQ(submit({"parallel.threads=6"}, 4, &err), "exit 1");
  EXPECT_TRUE(has(err, "parallel.threads 6 and --cpus-per-task 4 disagree")) << err;
  fs::remove_all(dir);
}

TEST(SlurmPaths, RunDirResolvesAgainstTheWorkdir) {
  Config c = config_with();
  EXPECT_EQ(absolute_run_dir(c, "/w"), "/w/runs/seed");
  EXPECT_EQ(sbatch_path(c, "/w/"), "/w/runs/seed/job.sbatch");
  c.run_dir = "/data/runs/x/";
  EXPECT_EQ(absolute_run_dir(c, "/w"), "/data/runs/x");
  c.run_dir = "../out/./x";
  EXPECT_EQ(absolute_run_dir(c, "/w/sub"), "/w/out/x");
}

TEST(SlurmPaths, ShellQuote) {
  EXPECT_EQ(shell_quote("/a/b-c_d.e"), "/a/b-c_d.e");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("x=[1,2]"), "'x=[1,2]'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
}

TEST(SlurmLauncher, PmixWhenListedOrUnknown) {
  EXPECT_EQ(choose_launcher(""), "srun --mpi=pmix");
  EXPECT_EQ(choose_launcher("MPI plugin types are...\n\tpmix\n\tnone\n\tpmi2\n"), "srun --mpi=pmix");
  EXPECT_EQ(choose_launcher("MPI plugin types are...\n\tnone\n\tpmi2\n"), "mpirun");
}

// submit resolves parallel.host_memory: auto from `sinfo -h -N -o %m`: the smallest node.
TEST(SlurmNodeMemory, SmallestNodeOfThePartition) {
  EXPECT_EQ(smallest_node_memory("257000\n128000+\n257000\n"), std::optional<uint64_t>(128000ull << 20));
  EXPECT_EQ(smallest_node_memory("  64000\n"), std::optional<uint64_t>(64000ull << 20));
  EXPECT_EQ(smallest_node_memory(""), std::nullopt);
  EXPECT_EQ(smallest_node_memory("0\nMEMORY\n"), std::nullopt);  // unknown to Slurm, or a header
}

// A ConfigError whose message contains every part.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    for (const auto& p : parts) EXPECT_TRUE(has(e.what(), p)) << e.what() << "\n  lacks: " << p;
  }
}

TEST(SlurmValidation, GridNeedsMoreRanksThanTheAllocation) {
  const Config c = config_with({"slurm.nodes=1"});
  expect_error([&] { check_allocation(c, {4, 2}); },
               {"test.yaml", "parallel.grid [4, 2]", "multiple of 8 ranks", "slurm.nodes 1",
                "parallel.devices_per_node 2 = 2", "use slurm.nodes 4"});
  expect_error([&] { check_allocation(config_with({"slurm.nodes=3"}), {2, 2}); }, {"multiple of 4", "= 6"});
  EXPECT_NO_THROW(check_allocation(config_with({"slurm.nodes=4"}), {2, 2}));
}

TEST(SlurmValidation, BatchMustDivideAmongSampleGroups) {
  // 2 nodes x 2 = 4 ranks on a 1x1 grid: 4 sample groups.
  expect_error([&] { check_allocation(config_with({"training.batch_size=6"}), {1, 1}); },
               {"training.batch_size 6", "4 sample groups", "4 ranks"});
  EXPECT_NO_THROW(check_allocation(config_with({"training.batch_size=8"}), {1, 1}));
}

TEST(SlurmValidation, MalformedTimeIsRefusedAgain) {
  Config c = config_with();
  c.slurm.time = "1:2:3:4";  // the parser refuses this; the renderer checks again
  expect_error([&] { render(c); }, {"slurm.time", "'1:2:3:4'", "HH:MM:SS"});
  EXPECT_THROW(config_with({"slurm.time=25:61:00"}), ConfigError);
}

TEST(SlurmValidation, PlanMustMatchTheAllocation) {
  const Config c = config_with();
  const ShardPlan eight = make_shard_plan(build_model_spec(c), {2, 2}, 8);
  expect_error([&] { render_sbatch(c, eight, "/c.yaml", options()); }, {"8 ranks", "the job 4"});
}

TEST(SlurmValidation, PathsAbsoluteAndLinesSingle) {
  SubmitOptions o = options();
  o.halotrain = "build/halotrain";
  expect_error([&] { render(config_with(), o); }, {"the halotrain path must be absolute", "build/halotrain"});
  Config c = config_with();
  c.slurm.extra = {"--mem=0\necho pwned"};
  expect_error([&] { render(c); }, {"slurm.extra must be one line"});
  o = options();
  o.sets = {"name=a\nb"};
  expect_error([&] { render(config_with(), o); }, {"--set must be one line"});
}

TEST(Process, CollectsOutputAndExitCode) {
  CommandResult r = run_command({"sh", "-c", "echo out; echo err >&2; exit 7"});
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  r = run_command({"halotrain-no-such-program"});
  EXPECT_FALSE(r.started);
  EXPECT_TRUE(has(r.error, "not found on PATH"));
  r = run_command({"sleep", "10"}, 1);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
}

TEST(StopSignals, WarningMeansRequeueTermMeansTerminate) {
  EXPECT_EQ(signal_number("usr2"), SIGUSR2);
  EXPECT_EQ(signal_number("SIGUSR1"), SIGUSR1);
  EXPECT_EQ(signal_number("KILL"), -1);
  EXPECT_THROW(install_stop_handlers("BOGUS"), std::invalid_argument);
  install_stop_handlers("USR1");
  clear_stop_requests();
  EXPECT_EQ(pending_stop(), StopRequest::None);
  std::raise(SIGTERM);
  EXPECT_EQ(pending_stop(), StopRequest::Terminate);
  std::raise(SIGUSR1);
  EXPECT_EQ(pending_stop(), StopRequest::Requeue) << "the warning wins: the TERM is Slurm ending this run";
  clear_stop_requests();
  EXPECT_EQ(pending_stop(), StopRequest::None);
  EXPECT_LT(int(StopRequest::None), int(StopRequest::Requeue));  // a max-reduce picks the strongest
  EXPECT_LT(int(StopRequest::Requeue), int(StopRequest::Terminate));
}

// A fake `scontrol` first on PATH, for request_requeue.
class FakeScontrol : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fake_scontrol_" + std::to_string(getpid()));
    fs::create_directories(dir_ / "bin");
    fs::create_directories(dir_ / "run");
    old_path_ = std::getenv("PATH") ? std::getenv("PATH") : "";
    setenv("PATH", ((dir_ / "bin").string() + ":" + old_path_).c_str(), 1);
  }
  void TearDown() override {
    setenv("PATH", old_path_.c_str(), 1);
    unsetenv("SLURM_JOB_ID");
    fs::remove_all(dir_);
  }
  void fake(const std::string& body) {
    const fs::path p = dir_ / "bin" / "scontrol";
    std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
    fs::permissions(p, fs::perms::owner_all);
  }
  std::string run_dir() const { return (dir_ / "run").string(); }
  std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
  std::string old_path_;
};

TEST_F(FakeScontrol, RequeueRunsScontrolAndLeavesTheMarker) {
  fake("echo \"$@\" > " + (dir_ / "args").string());
  setenv("SLURM_JOB_ID", "4242", 1);
  std::string error;
  ASSERT_TRUE(request_requeue(run_dir(), &error)) << error;
  EXPECT_EQ(slurp(dir_ / "args"), "requeue 4242\n");
  EXPECT_EQ(slurp(requeue_marker_path(run_dir())), "4242\n");
}

TEST_F(FakeScontrol, FailureGivesTheReasonAndNoMarker) {
  fake("echo 'slurm_requeue error: Job is not requeueable' >&2; exit 1");
  setenv("SLURM_JOB_ID", "4242", 1);
  std::string error;
  EXPECT_FALSE(request_requeue(run_dir(), &error));
  EXPECT_TRUE(has(error, "Job is not requeueable")) << error;
  EXPECT_TRUE(has(error, "exit 1")) << error;
  EXPECT_FALSE(fs::exists(requeue_marker_path(run_dir())));
}

TEST_F(FakeScontrol, OutsideSlurmThereIsNothingToRequeue) {
  fake("exit 0");
  unsetenv("SLURM_JOB_ID");
  std::string error;
  EXPECT_FALSE(request_requeue(run_dir(), &error));
  EXPECT_TRUE(has(error, "SLURM_JOB_ID is not set")) << error;
  EXPECT_FALSE(fs::exists(requeue_marker_path(run_dir())));
}

}  // namespace
}  // namespace ht
