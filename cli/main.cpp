// The `halotrain` command line (SPEC section 2). Exit codes: 0 ok, 1 user error (one clear
// message), 2 internal error, 3 stopped for requeue.
#include <mpi.h>

#include <csignal>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hdf5.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>

#include "importer/keras_import.hpp"
#include "orchestrator/config_io.hpp"
#include "orchestrator/plan.hpp"
#include "orchestrator/plan_report.hpp"
#include "orchestrator/submit.hpp"
#include "worker/comm/mpi_comm.hpp"
#include "worker/io/convert_data.hpp"
#include "worker/io/keras_h5.hpp"
#include "worker/io/prediction_output.hpp"
#include "worker/io/synthetic_data.hpp"
#include "worker/run/inference.hpp"
#include "worker/run/run_report.hpp"
#include "worker/run/signals.hpp"
#include "worker/run/trainer.hpp"
#include "worker/runtime/log.hpp"
#include "worker/runtime/tensor.hpp"

namespace {

using namespace ht;

// `plan --schedule`: the step schedule of one rank (default: the busiest) instead of the plan.
int print_schedule(const Config& config, const Plan& plan, int rank, bool json) {
  if (rank < 0) rank = plan.busiest.rank;
  if (rank >= plan.shards.world())
    throw ConfigError(fmt::format("plan --rank {}: the plan has ranks 0 to {}", rank, plan.shards.world() - 1));
  const StepSchedule schedule = training_schedule(config, plan.shards, rank, plan.policies);
  std::cout << (json ? render_schedule_json(schedule, plan.model()) + "\n"
                     : render_schedule_text(schedule, plan.model()));
  const MemoryEstimate& e = plan.ranks[size_t(rank)];
  if (!json && e.validation)
    std::cout << fmt::format("the run's peak on rank {}, {}, is validation's (its forward beside what the step "
                             "holds), not this step's\n",
                             rank, format_size(e.total));
  return 0;
}

int cmd_plan(const std::string& path, const std::vector<std::string>& sets, bool json, const std::string& html,
             const std::string& mode, bool schedule, int rank) {
  Config config = load_config(path, sets);
  const ModelSpec model = build_model_spec(config);
  ShardPlan shards = make_shard_plan(model, plan_grid(config, model));
  if (mode == "predict") {
    if (schedule) {
      if (rank < 0) rank = estimate_inference_memory_max(config, shards, Inference::Predict).rank;
      if (rank >= shards.world())
        throw ConfigError(fmt::format("plan --rank {}: the plan has ranks 0 to {}", rank, shards.world() - 1));
      const StepSchedule s = inference_schedule(config, shards, rank, Inference::Predict);
      std::cout << (json ? render_schedule_json(s, model) + "\n" : render_schedule_text(s, model));
      return 0;
    }
    std::cout << render_predict_plan(config, shards, json);
    const std::string verdict = predict_fit_verdict(config, shards);
    if (verdict.empty()) return 0;
    std::cerr << "halotrain plan: " << verdict << "\n";
    return 1;
  }
  Plan plan = make_plan(config, std::move(shards));
  if (schedule) return print_schedule(config, plan, rank, json);
  plan.decodes = data_whole_decodes(config, model);
  std::cout << (json ? render_plan_json(config, plan) : render_plan_text(config, plan));
  if (!html.empty()) {
    publish_page(html, render_report_html(config, plan, nullptr, read_thumbnail(config, model)));
    std::cerr << "wrote " << html << "\n";
  }
  if (!plan.fits()) {
    std::cerr << "halotrain plan: " << plan.verdict << "\n";
    return 1;
  }
  return 0;
}

char** g_argv = nullptr;

// The supervised worker and the first stop signal the supervisor received; handlers touch
// only these.
volatile std::sig_atomic_t g_child = 0;
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void forward_to_child(int sig) {
  if (!g_stop_signal) g_stop_signal = sig;
  if (g_child > 0) kill(pid_t(g_child), sig);
}

// `recycle.mode: restart` outside Slurm/MPI: this process supervises a child that trains,
// exits 3 at each recycle point after a checkpoint, and is started again to resume. The
// child runs in its own process group, so a signal meant for the job (Ctrl-C on a terminal,
// `kill -TERM -<pgid>`, a plain `kill <supervisor>`) reaches it once, forwarded from here;
// it then stops cleanly (checkpoint, exit 3) and is not started again. A child whose
// supervisor dies gets SIGTERM (PR_SET_PDEATHSIG): it never trains on as an orphan.
int relaunch_until_done(const Config& config) {
  const int warning = signal_number(config.slurm.signal);
  for (int sig : {SIGTERM, SIGINT, warning}) {
    if (sig <= 0) continue;
    struct sigaction sa {};
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = forward_to_child;
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, nullptr);
  }
  const pid_t supervisor = getpid();
  for (int launches = 1;; ++launches) {
    if (g_stop_signal) return 3;  // asked to stop between two launches: the last one checkpointed
    const pid_t child = fork();
    if (child < 0) throw std::runtime_error("fork failed");
    if (child == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != supervisor) _exit(3);  // the supervisor is already gone
      setenv("HALOTRAIN_SUPERVISED", "1", 1);
      // Blocked across exec until the worker's own handlers are in place: a stop forwarded
      // while it starts waits for them instead of killing it before its first checkpoint.
      const sigset_t stops = stop_signal_set(warning);
      sigprocmask(SIG_BLOCK, &stops, nullptr);
      execv("/proc/self/exe", g_argv);
      _exit(2);
    }
    setpgid(child, child);  // also here: whichever runs first, the group exists before a signal
    g_child = child;
    if (g_stop_signal) kill(child, int(g_stop_signal));  // arrived while forking
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    g_child = 0;
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
    if (code != 3) return code;
    if (g_stop_signal) {
      log().info("recycle: the worker stopped on {} with a checkpoint; not starting it again",
                 strsignal(int(g_stop_signal)));
      return 3;
    }
    log().info("recycle: worker process {} exited for restart; starting it again", launches);
  }
}

int cmd_train(const std::string& path, const std::vector<std::string>& sets, const TrainOptions& options) {
  Config config = load_config(path, sets);
  if (config.recycle.mode == RecycleMode::Restart && config.recycle.every_steps > 0 && !launched_by_mpi() &&
      !std::getenv("HALOTRAIN_SUPERVISED"))
    return relaunch_until_done(config);
  install_stop_handlers(config.slurm.signal, config.slurm.signal_before);
  log().info("config {} (resolved):\n{}", path, to_yaml(config));
  const TrainSummary s = run_training(config, options);
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  std::string validation;
  for (const auto& [name, v] : s.validation) validation += fmt::format(" val_{} {:.6f},", name, v);
  log().info("trained {} steps, final loss {:.6f},{} peak device memory {:.1f} MiB, process peak RSS {:.1f} MiB; "
             "checkpoint {}",
             s.steps, s.final_loss, validation, s.peak_device_bytes / 1048576.0, usage.ru_maxrss / 1024.0,
             s.checkpoint);
  if (!s.stopped_early.empty()) log().info("the run ended before training.steps: {}", s.stopped_early);
  return 0;
}

// This process's MPI rank (0 outside MPI): one rank prints a collective command's result.
int mpi_rank() {
  int initialized = 0, rank = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int cmd_evaluate(const std::string& path, const std::vector<std::string>& sets, const std::string& checkpoint,
                 const std::string& data) {
  const Config config = load_config(path, sets);
  const EvaluationResult r = run_evaluation(config, checkpoint, data);
  if (mpi_rank() == 0) {
    std::string line = fmt::format("{} (step {}) on {}, {} images:", r.checkpoint, r.step, r.data, r.images);
    for (const auto& [name, v] : r.values) line += fmt::format(" {} {:.6f}", name, v);
    std::cout << line << "\nwrote " << r.json << "\n";
  }
  return 0;
}

int cmd_predict(const std::string& path, const std::vector<std::string>& sets, const std::string& checkpoint,
                const std::string& input, const std::string& output, bool float32, bool trace_memory) {
  const Config config = load_config(path, sets);
  const PredictionResult r = run_prediction(config, checkpoint, input, output, float32, trace_memory);
  if (mpi_rank() == 0)
    std::cout << fmt::format("wrote {}: predictions {} ({}); peak device memory {} B, predicted {} B\n", output,
                             fmt::format("[{}]", fmt::join(r.shape, ", ")),
                             !is_prediction_directory(output) ? "float32"
                             : r.shape.size() == 2            ? "scores.csv"
                             : float32                        ? "a BigTIFF per image, uint8 and float32"
                                                              : "a BigTIFF per image, uint8",
                             r.peak_device_bytes, r.predicted_peak_device_bytes);
  return 0;
}

// One subcommand: its parser, and what runs once it parsed. Its arguments live in a
// shared struct the action holds, so each command's options sit beside its action.
struct Command {
  CLI::App* parser = nullptr;
  std::function<int()> action;
};

// CONFIG and --set, which most commands take.
struct ConfigArgs {
  std::string path;
  std::vector<std::string> sets;
};
void add_config_args(CLI::App* sub, ConfigArgs& args) {
  sub->add_option("CONFIG", args.path, "YAML config")->required();
  sub->add_option("--set", args.sets, "override a key: --set parallel.grid=[2,1]");
}

Command train_command(CLI::App& app) {
  struct Args : ConfigArgs {
    TrainOptions options;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("train", "train a config (all shards here, or one per MPI rank)");
  add_config_args(sub, *a);
  sub->add_flag("--trace-memory", a->options.trace_memory,
                "write every allocation of the run's second step to run_dir/memory-trace-RANK.json, by operation of "
                "`plan --schedule`");
  return {sub, [a] { return cmd_train(a->path, a->sets, a->options); }};
}

Command plan_command(CLI::App& app) {
  struct Args : ConfigArgs {
    bool json = false, schedule = false;
    int rank = -1;
    std::string html, mode = "train";
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("plan", "validate a config and print the shard and memory plan");
  add_config_args(sub, *a);
  sub->add_flag("--json", a->json, "print JSON");
  sub->add_option("--html", a->html, "also write the plan as a self-contained HTML page to this file");
  sub->add_option("--mode", a->mode, "train (default) or predict: the memory of inference")
      ->check(CLI::IsMember({"train", "predict"}));
  sub->add_flag("--schedule", a->schedule,
                "print a training step's operations in order (with --mode predict: a batch's), with the memory each "
                "allocates and frees, instead");
  sub->add_option("--rank", a->rank, "with --schedule: this rank's (default: the one with the highest peak)")
      ->check(CLI::NonNegativeNumber);
  return {sub, [a] { return cmd_plan(a->path, a->sets, a->json, a->html, a->mode, a->schedule, a->rank); }};
}

Command evaluate_command(CLI::App& app) {
  struct Args : ConfigArgs {
    std::string checkpoint, data;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("evaluate", "loss and metrics of a checkpoint over a whole file");
  add_config_args(sub, *a);
  sub->add_option("--checkpoint", a->checkpoint, "checkpoint (default: the newest valid one in run_dir)");
  sub->add_option("--data", a->data, "HDF5 file or CSV manifest with images and targets (default: data.validation)");
  return {sub, [a] { return cmd_evaluate(a->path, a->sets, a->checkpoint, a->data); }};
}

Command predict_command(CLI::App& app) {
  struct Args : ConfigArgs {
    std::string checkpoint, input, output;
    bool float32 = false, trace_memory = false;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("predict", "the sharded forward of every image, written to an HDF5 file or a "
                                            "directory of BigTIFFs");
  add_config_args(sub, *a);
  sub->add_option("--checkpoint", a->checkpoint, "checkpoint to run")->required();
  sub->add_option("--input", a->input, "HDF5 file with dataset data.images, or a CSV manifest")->required();
  sub->add_option("--output", a->output,
                  "HDF5 file to write (dataset 'predictions'), or DIR/: one BigTIFF per image (a classifier: "
                  "DIR/scores.csv)")
      ->required();
  sub->add_flag("--float32", a->float32, "with --output DIR/: also NAME-float32.tif, the probabilities as float32");
  sub->add_flag("--trace-memory", a->trace_memory,
                "write every allocation of the first batch to run_dir/memory-trace-predict-RANK.json, by operation "
                "of `plan --mode predict --schedule`");
  return {sub, [a] {
            return cmd_predict(a->path, a->sets, a->checkpoint, a->input, a->output, a->float32, a->trace_memory);
          }};
}

Command report_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("report", "write RUN_DIR/report.html: curves, memory, the shard map");
  sub->add_option("RUN_DIR", *run_dir, "a run's run_dir")->required();
  return {sub, [run_dir] {
            std::cout << "wrote " << report_run_dir(*run_dir) << "\n";
            return 0;
          }};
}

Command make_data_command(CLI::App& app) {
  struct Args {
    SyntheticOptions data;
    std::string out;
    bool masks = false;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("make-data", "write a synthetic, learnable dataset");
  sub->add_option("OUT", a->out, "output .h5 file")->required();
  sub->add_option("--count", a->data.count, "images")->required()->check(CLI::PositiveNumber);
  sub->add_option("--height", a->data.height, "rows")->required()->check(CLI::PositiveNumber);
  sub->add_option("--width", a->data.width, "columns")->required()->check(CLI::PositiveNumber);
  sub->add_option("--channels", a->data.channels, "channels")->check(CLI::PositiveNumber);
  auto* classes = sub->add_option("--classes", a->data.classes, "classes of the labels")->check(CLI::PositiveNumber);
  sub->add_flag("--masks", a->masks, "write per-pixel masks instead of labels")->excludes(classes);
  sub->add_option("--seed", a->data.seed, "random seed");
  return {sub, [a] {
            if (a->masks) a->data.targets = TargetKind::Masks;
            write_synthetic_dataset(a->out, a->data);
            std::cout << "wrote " << a->out << "\n";
            return 0;
          }};
}

Command submit_command(CLI::App& app) {
  auto a = std::make_shared<SubmitCommand>();
  auto* sub = app.add_subcommand("submit", "write run_dir/job.sbatch for a config and submit it with sbatch");
  sub->add_option("CONFIG", a->config_path, "YAML config")->required();
  sub->add_option("--set", a->sets, "override a key: --set parallel.grid=[2,1]");
  sub->add_flag("--dry-run", a->dry_run, "print the sbatch script, submit nothing");
  sub->add_option("--launcher", a->launcher,
                  "how the script starts the ranks (default: srun --mpi=pmix if Slurm has PMIx, else mpirun)");
  sub->add_option("--cpus-per-task", a->cpus_per_task,
                  "CPUs per rank (default: 1 for cuda; whole nodes shared by their ranks for cpu)")
      ->check(CLI::NonNegativeNumber);
  return {sub, [a] { return run_submit(*a, std::cout, std::cerr); }};
}

Command import_command(CLI::App& app) {
  struct Args {
    std::string model, config, weights, input_size;
    int channels = 0;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("import", "a Keras model (.h5 from model.save, or .json) as a config and init weights");
  sub->add_option("MODEL", a->model, "Keras model file (.h5, .json) or ONNX file (.onnx)")->required();
  sub->add_option("-o,--output", a->config, "config to write (default: MODEL's name with .yaml)");
  sub->add_option("--weights", a->weights, "init weights to write (default: MODEL's name with -init.h5)");
  sub->add_option("--input-size", a->input_size, "H,W: the image size of a model whose input leaves it open");
  sub->add_option("--channels", a->channels,
                  "the image's channels: a pretrained first conv's kernel summed over its input channels for 1 "
                  "(gray images into an RGB model), repeated and scaled otherwise")
      ->check(CLI::PositiveNumber);
  return {sub, [a] {
            ImportOptions options;
            if (!a->input_size.empty()) {
              int h = 0, w = 0;
              char comma = 0, rest = 0;
              if (std::sscanf(a->input_size.c_str(), "%d%c%d%c", &h, &comma, &w, &rest) != 3 || comma != ',' ||
                  h < 1 || w < 1)
                throw ConfigError(fmt::format("--input-size {}: expected H,W (two integers >= 1, such as 1024,768)",
                                              a->input_size));
              options.input_height = h;
              options.input_width = w;
            }
            options.channels = a->channels;
            return run_import(a->model, a->config, a->weights, options, std::cout);
          }};
}

Command convert_data_command(CLI::App& app) {
  struct Args : ConfigArgs {
    std::string out;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("convert-data", "data.train (a CSV manifest) as an HDF5 file, after data.fit");
  sub->add_option("CONFIG", a->path, "config whose data.train is a manifest")->required();
  sub->add_option("OUT", a->out, "output .h5 file")->required();
  sub->add_option("--set", a->sets, "override a config key");
  return {sub, [a] {
            convert_data(load_config(a->path, a->sets), a->out, std::cout);
            return 0;
          }};
}

Command inspect_command(CLI::App& app) {
  auto file = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("inspect", "show what a checkpoint or Keras weights file holds");
  sub->add_option("FILE", *file, ".h5 file")->required();
  return {sub, [file] { return inspect_file(*file, std::cout); }};
}

int run(int argc, char** argv) {
  CLI::App app{"halotrain: trains CNNs on images too large for one device, sharded spatially"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {
      train_command(app),  plan_command(app),      evaluate_command(app), predict_command(app),
      report_command(app), make_data_command(app), submit_command(app),   import_command(app),
      convert_data_command(app), inspect_command(app)};
  // A word that names no command gets a message that names it (CLI11 would only say that a
  // subcommand is required).
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const Command& c : commands) names.push_back(c.parser->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end())
      throw ConfigError(fmt::format("unknown command '{}'; the commands are {} (see halotrain --help)", argv[1],
                                    fmt::join(names, ", ")));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 1;
  }
  for (const Command& c : commands)
    if (*c.parser) return c.action();
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  g_argv = argv;
  // A full disk or a file-size limit must surface as a failed write with a message, not as
  // a silent kill by SIGXFSZ.
  signal(SIGXFSZ, SIG_IGN);
  // Every file is closed by its owner; HDF5's own exit-time cleanup would crash on a file
  // whose close already failed (disk full), turning a clear error into a segfault.
  H5dont_atexit();
  const std::string command = argc > 1 ? argv[1] : "";
  const bool use_mpi =
      ht::launched_by_mpi() && (command == "train" || command == "evaluate" || command == "predict");
  int world = 1;
  if (use_mpi) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
  }
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const ht::ConfigError& e) {
    ht::log().error("{}", e.what());
    code = 1;
  } catch (const ht::DeviceMemoryError& e) {
    ht::log().error("{}", e.what());
    code = 1;
  } catch (const ht::TrainingDiverged& e) {
    ht::log().error("{}", e.what());
    code = 1;
  } catch (const ht::StopRequested& e) {
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    ht::log().info("{} (process peak RSS {:.1f} MiB)", e.what(), usage.ru_maxrss / 1024.0);
    code = 3;
  } catch (const std::exception& e) {
    ht::log().error("internal error: {}", e.what());
    code = 2;
  }
  if (use_mpi) {
    // A failed rank takes the job down at once, so no other rank waits in a collective.
    // Exit 3 is agreed by all ranks at a step boundary, so it finalizes normally.
    if ((code == 1 || code == 2) && world > 1) MPI_Abort(MPI_COMM_WORLD, code);
    MPI_Finalize();
  }
  return code;
}
