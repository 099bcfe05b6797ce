#pragma once
// Set-up the task tests share: a scratch folder per test for the set readers and writers
// (test_classification, test_seq2seq_data), and for the task trainers (test_classifier_train,
// test_seq2seq_train) a scratch folder per suite, the built-in DeepSpeed config, the plan
// function's error message, programs run with their output captured, and csv_monitor columns.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/core/tensor.h"
#include "ds/train/options.h"

namespace ds::testing {

// The message of the ds::Error that f throws ("" when it does not throw).
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

// A fresh folder per test, temp/<prefix><pid>_<test name>, removed after it.
class ScratchDirTest : public ::testing::Test {
 protected:
  explicit ScratchDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           (prefix_ + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return dir_ / name;
  }
  template <class F>
  static std::string error_of(F&& f) {
    return error_message(std::forward<F>(f));
  }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

// A task trainer's suite: `plan` is its plan function (train::plan_classifier, ...). The suite's
// SetUpTestSuite calls set_up_suite, then writes its data under root_.
template <class Plan, Plan (*plan)(const train::Options&, const train::Given&, const char*)>
class TaskTrainTest : public ::testing::Test {
 protected:
  // root_ = a fresh temp/<prefix><pid>; builtin_ = configs/ds_demo.json.
  static void set_up_suite(const std::string& prefix) {
    root_ = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    std::ifstream cfg(std::filesystem::path(DS_SOURCE_DIR) / "configs" / "ds_demo.json");
    builtin_ = {std::istreambuf_iterator<char>(cfg), {}};
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }

  // The options a test gives explicitly.
  train::Given given() const {
    train::Given g;
    g.model = g.per_device_train_batch_size = g.learning_rate = g.warmup_steps = g.max_steps = true;
    return g;
  }
  // The plan function's error message ("" when it plans).
  static std::string error_of(const train::Options& o, const train::Given& g) {
    return error_message([&] { plan(o, g, builtin_.c_str()); });
  }
  // Runs `cmd` with stdout (and stderr unless `quiet_stderr`) to root_/<log_name>; *log = what it
  // wrote. Returns the exit status (-1 when it did not exit).
  static int run_command(const std::string& cmd, std::string* log,
                         const std::string& log_name = "proc_log.txt", bool quiet_stderr = false) {
    const std::filesystem::path file = root_ / log_name;
    const std::string err = quiet_stderr ? (root_ / "proc_err.txt").string() : "&1";
    const int status = std::system((cmd + " > " + file.string() + " 2>" + err).c_str());
    std::ifstream f(file);
    *log = {std::istreambuf_iterator<char>(f), {}};
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // The --deepspeed of the two-rank tests: a global batch of 8, ZeRO-3 partitioning every
  // parameter, followed by a space.
  static constexpr const char* kZero3Batch8 =
      "--deepspeed '{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": \"auto\", "
      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}, "
      "\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0}}' ";
  // The train losses (Train_Samples_train_loss.csv's text) of `ds_train_cmd` (the program, the
  // data and the model) for 4 ZeRO-3 steps at a global batch of 8 into root_/offload_<tag>, with
  // `offload` ("" or offload sections ending ", ") in zero_optimization; checks that the log
  // names NVMe exactly when `offload` is given.
  static std::string zero3_losses(const std::string& ds_train_cmd, const std::string& tag,
                                  const std::string& offload) {
    const std::filesystem::path out = root_ / ("offload_" + tag);
    std::string said;
    EXPECT_EQ(run_command(ds_train_cmd +
                              " --threads 1 --max_steps 4 --learning_rate 1e-2 --eval_steps 0 "
                              "--export_hf none --output_dir " +
                              out.string() +
                              " --deepspeed '{\"train_batch_size\": 8, "
                              "\"train_micro_batch_size_per_gpu\": 8, \"optimizer\": {\"type\": "
                              "\"AdamW\", \"params\": {\"lr\": \"auto\"}}, "
                              "\"zero_optimization\": {\"stage\": 3, " +
                              offload + "\"stage3_param_persistence_threshold\": 0}}'",
                          &said, "offload_" + tag + ".txt"),
              0)
        << said;
    EXPECT_EQ(said.find("\"nvme\"") != std::string::npos, !offload.empty()) << said;
    std::ifstream f(out / "metrics" / "Train_Samples_train_loss.csv");
    return {std::istreambuf_iterator<char>(f), {}};
  }
  // The task trainer `Trainer` (observer `Recorder`) from options `o` (`g` given), on the CPU and
  // with --device sim (the emulator: device memory on the CPU's kernels) into
  // root_/<tag>_<device>: `steps` steps, the evaluation fit() ends with and the Hugging Face export
  // (the model, or a LoRA run's PEFT adapter). The device run says where it runs, and its step
  // losses, evaluation loss and exported tensors equal the host's bit for bit; check(host, device)
  // compares what else the task reports.
  template <class Trainer, class Recorder, class Check>
  void expect_device_run_as_host(train::Options o, const train::Given& g, const std::string& tag,
                                 int steps, Check check) {
    std::unique_ptr<Trainer> t[2];
    Recorder rec[2];
    std::map<std::string, Tensor> exported[2];
    for (int i : {0, 1}) {
      o.device = i ? "sim" : "cpu";
      o.output_dir = (root_ / (tag + "_" + o.device)).string();
      o.max_steps = steps;
      t[i] = std::make_unique<Trainer>(plan(o, g, builtin_.c_str()), rec[i]);
      t[i]->fit();
      const std::filesystem::path hf = std::filesystem::path(o.output_dir) / "hf";
      t[i]->export_model(hf.string());
      const bool adapter = std::filesystem::exists(hf / "adapter_model.safetensors");
      exported[i] = safetensors::load(
          (hf / (adapter ? "adapter_model.safetensors" : "model.safetensors")).string());
    }
    bool said = false;
    for (const std::string& m : rec[1].messages) said |= m.rfind("device: sim:0", 0) == 0;
    EXPECT_TRUE(said) << "the device run does not say where it runs";
    ASSERT_EQ(rec[0].steps.size(), static_cast<size_t>(steps));
    ASSERT_EQ(rec[1].steps.size(), rec[0].steps.size());
    for (size_t k = 0; k < rec[0].steps.size(); ++k)
      EXPECT_EQ(rec[1].steps[k].loss, rec[0].steps[k].loss) << "step " << k;
    ASSERT_TRUE(t[0]->last_eval() && t[1]->last_eval());
    EXPECT_EQ(t[1]->last_eval()->loss, t[0]->last_eval()->loss);
    ASSERT_EQ(exported[1].size(), exported[0].size());
    for (const auto& [name, host] : exported[0])
      EXPECT_EQ(exported[1].at(name).to_vector(), host.to_vector()) << name;
    check(*t[0], *t[1]);
  }
  // The offload sections that put the optimizer state and the parameters on NVMe under `dir`.
  static std::string nvme_offload(const std::filesystem::path& dir) {
    std::filesystem::create_directories(dir);
    const std::string d = dir.string();
    return "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"" + d +
           "\"}, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"" + d + "\"}, ";
  }
  // The value column of a csv_monitor file (step,value rows after a header).
  static std::vector<double> csv_column(const std::filesystem::path& f) {
    std::vector<double> v;
    std::ifstream in(f);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) v.push_back(std::stod(line.substr(line.rfind(',') + 1)));
    return v;
  }

  static inline std::filesystem::path root_;
  static inline std::string builtin_;
};

}  // namespace ds::testing
