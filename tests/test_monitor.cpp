// The metrics files of ds_train (ds/runtime/monitor.h): DeepSpeed's csv_monitor layout, resume
// truncation, and an SVG chart that is well-formed; TensorBoard event files
// (ds/runtime/tensorboard_monitor.h) read back with the protobuf library, CRC-32C against RFC 3720,
// a file written by PyTorch's SummaryWriter (tests/fixtures/tensorboard, made by
// tests/fixtures/generators/gen_tensorboard_fixture.py); the monitors of a config
// (ds/runtime/monitor_master.h) and --report_to.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "ds/config/config.h"
#include "ds/core/crc32c.h"
#include "ds/core/error.h"
#include "ds/runtime/monitor.h"
#include "ds/runtime/monitor_master.h"
#include "ds/runtime/tensorboard_monitor.h"

using namespace ds::runtime;
namespace fs = std::filesystem;

namespace {

class Monitor : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ds_monitor_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string read(const fs::path& p) {
    std::ifstream f(p);
    return {std::istreambuf_iterator<char>(f), {}};
  }
  fs::path dir_;
};

TEST_F(Monitor, DeepSpeedCsvLayout) {
  CsvMonitor m(dir_, "job");
  m.write_events({{"Train/Samples/train_loss", 10.5, 8}, {"Train/Samples/lr", 0.001, 8}});
  m.write("Train/Samples/train_loss", 9.25, 16);
  m.write("plain name", 1.0, 16);
  EXPECT_EQ(read(dir_ / "job" / "Train_Samples_train_loss.csv"),
            "step,train_loss\n8,10.5\n16,9.25\n");
  EXPECT_EQ(read(dir_ / "job" / "Train_Samples_lr.csv"), "step,lr\n8,0.001\n");
  EXPECT_EQ(read(dir_ / "job" / "plain_name.csv"), "step,plain name\n16,1\n");
  const auto rows = CsvMonitor::read(dir_ / "job" / "Train_Samples_train_loss.csv");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1], (std::pair<int64_t, double>{16, 9.25}));
}

TEST_F(Monitor, FreshRunRewritesResumeKeepsRowsUpToTheCheckpoint) {
  {
    CsvMonitor m(dir_, "job");
    for (int s = 1; s <= 5; ++s) m.write("Train/Samples/train_loss", 10.0 - s, s * 8);
  }
  {
    // Resumed from the checkpoint at 24 samples: rows 32 and 40 were trained again.
    CsvMonitor m(dir_, "job", 24);
    m.write("Train/Samples/train_loss", 6.5, 32);
  }
  EXPECT_EQ(read(dir_ / "job" / "Train_Samples_train_loss.csv"),
            "step,train_loss\n8,9\n16,8\n24,7\n32,6.5\n");
  {
    CsvMonitor m(dir_, "job");  // a new run in the same folder starts the file again
    m.write("Train/Samples/train_loss", 11.0, 8);
  }
  EXPECT_EQ(read(dir_ / "job" / "Train_Samples_train_loss.csv"), "step,train_loss\n8,11\n");
}

TEST_F(Monitor, SvgChart) {
  ChartSpec spec;
  spec.title = "loss <&>";
  spec.x_label = "step";
  spec.y_label = "loss";
  spec.series.push_back({"train", "#1f77b4", {{0, 10.9}, {50, 7.0}, {100, 5.5}}});
  spec.series.push_back({"eval", "#d62728", {{50, 7.2}, {100, 5.9}}, true});
  spec.lines.push_back({"unigram", 7.5});
  const std::string svg = render_svg_chart(spec);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("loss &lt;&amp;&gt;"), std::string::npos);  // escaped title
  EXPECT_EQ(svg.find("<&>"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);  // the reference line
  EXPECT_NE(svg.find(">unigram<"), std::string::npos);         // legend entry
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  write_svg_chart(dir_ / "c.svg", spec);
  EXPECT_EQ(read(dir_ / "c.svg"), svg);
}

TEST_F(Monitor, SvgChartWithoutDataStillRenders) {
  ChartSpec spec;
  spec.series.push_back({"empty", "#000", {}});
  const std::string svg = render_svg_chart(spec);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

// ---- CRC-32C ------------------------------------------------------------------------------

TEST(Crc32c, Rfc3720TestVectors) {
  // RFC 3720, appendix B.4 (iSCSI CRC-32C examples), and the usual check value.
  unsigned char buf[32];
  std::memset(buf, 0, sizeof(buf));
  EXPECT_EQ(ds::crc32c(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof(buf));
  EXPECT_EQ(ds::crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(ds::crc32c(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(ds::crc32c(buf, 32), 0x113FDB5Cu);
  EXPECT_EQ(ds::crc32c("123456789", 9), 0xE3069283u);
  // Continuing a CRC equals one pass over the whole.
  EXPECT_EQ(ds::crc32c("6789", 4, ds::crc32c("12345", 5)), 0xE3069283u);
}

// ---- TensorBoard ----------------------------------------------------------------------------

TEST(TensorBoard, ReadsPyTorchSummaryWriterFile) {
  // Written by torch.utils.tensorboard.SummaryWriter.add_scalar (gen_tensorboard_fixture.py).
  const auto ev =
      read_tensorboard_events(fs::path(DS_FIXTURE_DIR) / "tensorboard" / "pytorch.tfevents");
  ASSERT_EQ(ev.size(), 6u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_GT(ev[0].wall_time, 1.6e9);
  const std::vector<std::tuple<std::string, float, int64_t>> want = {
      {"Train/Samples/train_loss", 10.8254f, 64},
      {"Train/Samples/lr", 0.1f, 64},
      {"Train/Samples/loss_scale", 65536.0f, 64},
      {"Train/Samples/train_loss", 9.5f, 128},
      {"Train/Samples/lr", 0.05f, 128}};
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& e = ev[i + 1];
    ASSERT_EQ(e.scalars.size(), 1u) << i;
    EXPECT_EQ(e.scalars[0].first, std::get<0>(want[i]));
    EXPECT_EQ(e.scalars[0].second, std::get<1>(want[i]));  // float32, bit for bit
    EXPECT_EQ(e.step, std::get<2>(want[i]));
    EXPECT_TRUE(e.file_version.empty());
  }
}

TEST_F(Monitor, TensorBoardFileReadsBack) {
  fs::path file;
  {
    TensorBoardMonitor tb(dir_, "job");
    file = tb.file();
    EXPECT_EQ(file.parent_path(), dir_ / "job");
    EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u) << file;
    tb.write_events({{"Train/Samples/train_loss", 10.5, 8}, {"Train/Samples/lr", 1e-3, 8}});
    // Flushed after each batch: readable while the monitor is open.
    EXPECT_EQ(read_tensorboard_events(file).size(), 3u);
    tb.write_events({{"Train/Samples/train_loss", 9.25, 16}});
    tb.write_events({{"Train/Samples/lr", 0.0, 24}});  // a zero is a value too (a oneof member)
  }
  const auto ev = read_tensorboard_events(file);
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_TRUE(ev[0].scalars.empty());
  EXPECT_FALSE(ev[0].session_start);
  ASSERT_EQ(ev[1].scalars.size(), 1u);
  EXPECT_EQ(ev[1].scalars[0], (std::pair<std::string, float>{"Train/Samples/train_loss", 10.5f}));
  EXPECT_EQ(ev[1].step, 8);
  EXPECT_EQ(ev[2].scalars[0], (std::pair<std::string, float>{"Train/Samples/lr", 1e-3f}));
  EXPECT_EQ(ev[3].scalars[0].second, 9.25f);
  EXPECT_EQ(ev[3].step, 16);
  ASSERT_EQ(ev[4].scalars.size(), 1u);
  EXPECT_EQ(ev[4].scalars[0], (std::pair<std::string, float>{"Train/Samples/lr", 0.0f}));
  for (const auto& e : ev) EXPECT_GE(e.wall_time, ev[0].wall_time);
}

TEST_F(Monitor, TensorBoardRecordsAreChecked) {
  fs::path file;
  {
    TensorBoardMonitor tb(dir_, "job");
    file = tb.file();
    tb.write_events({{"Train/Samples/train_loss", 10.5, 8}});
  }
  std::string bytes = read(file);
  const std::string good = bytes;
  auto write = [&](const std::string& b) { std::ofstream(file, std::ios::binary) << b; };
  auto error_of = [&]() -> std::string {
    try {
      read_tensorboard_events(file);
    } catch (const ds::Error& e) {
      return e.what();
    }
    return "";
  };
  // A flipped bit in the last record's data, then in its length.
  const size_t last = good.find("Train/Samples");
  bytes[last] ^= 1;
  write(bytes);
  EXPECT_NE(error_of().find("the data's CRC does not match"), std::string::npos) << error_of();
  bytes = good;
  bytes[0] ^= 1;  // the first record's length
  write(bytes);
  EXPECT_NE(error_of().find("the length's CRC does not match"), std::string::npos) << error_of();
  // A writer killed mid-record: an error, or the records before it when the tail may be cut.
  write(good.substr(0, good.size() - 3));
  EXPECT_NE(error_of().find("is cut short"), std::string::npos) << error_of();
  EXPECT_EQ(read_tensorboard_events(file, /*allow_truncated_tail=*/true).size(), 1u);
}

TEST_F(Monitor, TensorBoardResumeStartsASession) {
  TensorBoardMonitor tb(dir_, "job", int64_t{24});
  tb.write_events({{"Train/Samples/train_loss", 6.5, 32}});
  const auto ev = read_tensorboard_events(tb.file());
  ASSERT_EQ(ev.size(), 3u);
  // TensorBoard drops the earlier files' events at steps >= 25: those this run trains again.
  EXPECT_TRUE(ev[1].session_start);
  EXPECT_EQ(ev[1].step, 25);
  EXPECT_EQ(ev[2].step, 32);
}

// ---- the monitors of a config, --report_to ----------------------------------------------------

TEST_F(Monitor, MasterWritesWhatTheConfigEnables) {
  const auto cfg = ds::config::parse_config_json(
      nlohmann::json::parse(fmt::format(R"({{"train_batch_size": 8,
                      "tensorboard": {{"enabled": true, "job_name": "tb"}},
                      "csv_monitor": {{"enabled": true, "output_path": "{}", "job_name": "csv"}}}})",
                                        (dir_ / "elsewhere").string())));
  EXPECT_TRUE(cfg.warnings.empty()) << fmt::format("{}", fmt::join(cfg.warnings, "\n"));
  MonitorSetup setup;
  setup.default_root = dir_ / "out";  // the empty tensorboard.output_path
  MonitorMaster m(cfg, setup);
  m.write_events({{"Train/Samples/train_loss", 3.0, 8}});
  ASSERT_NE(m.tensorboard(), nullptr);
  EXPECT_EQ(m.tensorboard()->log_dir(), dir_ / "out" / "tb");
  EXPECT_EQ(m.csv().log_dir(), dir_ / "elsewhere" / "csv");
  EXPECT_EQ(read_tensorboard_events(m.tensorboard()->file()).size(), 2u);
  EXPECT_EQ(read(dir_ / "elsewhere" / "csv" / "Train_Samples_train_loss.csv"),
            "step,train_loss\n8,3\n");

  // Another rank: no TensorBoard file, nothing written.
  setup.lead = false;
  setup.default_root = dir_ / "rank1";
  MonitorMaster other(cfg, setup);
  other.write_events({{"Train/Samples/train_loss", 3.0, 8}});
  EXPECT_EQ(other.tensorboard(), nullptr);
  EXPECT_FALSE(fs::exists(dir_ / "rank1" / "tb"));
}

TEST_F(Monitor, MasterWithoutMonitorsKeepsTheMetricsCsvAndReportToAdds) {
  const auto cfg =
      ds::config::parse_config_json(nlohmann::json::parse(R"({"train_batch_size": 8})"));
  MonitorSetup setup;
  setup.default_root = dir_;
  {
    MonitorMaster m(cfg, setup);
    EXPECT_EQ(m.tensorboard(), nullptr);
    EXPECT_EQ(m.csv().log_dir(), dir_ / "metrics");  // ds_train's record of the run
  }
  setup.report_to = parse_report_to({"tensorboard,csv"});
  MonitorMaster m(cfg, setup);
  ASSERT_NE(m.tensorboard(), nullptr);
  EXPECT_EQ(m.tensorboard()->log_dir(), dir_ / "DeepSpeedJobName");
  EXPECT_EQ(m.csv().log_dir(), dir_ / "DeepSpeedJobName");
}

TEST(ReportTo, ValuesAndErrors) {
  auto r = parse_report_to({});
  EXPECT_FALSE(r.tensorboard || r.csv);
  r = parse_report_to({"none"});
  EXPECT_FALSE(r.tensorboard || r.csv);
  r = parse_report_to({"tensorboard"});
  EXPECT_TRUE(r.tensorboard && !r.csv);
  r = parse_report_to({"csv", "tensorboard"});
  EXPECT_TRUE(r.tensorboard && r.csv);
  r = parse_report_to({"all"});
  EXPECT_TRUE(r.tensorboard && r.csv);
  auto error_of = [](std::vector<std::string> v) -> std::string {
    try {
      parse_report_to(v);
    } catch (const ds::Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string wandb = error_of({"tensorboard", "wandb"});
  EXPECT_NE(wandb.find("--report_to wandb"), std::string::npos) << wandb;
  EXPECT_NE(wandb.find("wandb sync --sync-tensorboard"), std::string::npos) << wandb;
  EXPECT_NE(error_of({"comet_ml"}).find("TensorBoard"), std::string::npos);
  EXPECT_NE(error_of({"mlflow"}).find("allowed are tensorboard, csv"), std::string::npos);
  EXPECT_NE(error_of({"none,csv"}).find("cannot be combined"), std::string::npos);
}

}  // namespace
