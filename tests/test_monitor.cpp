// The metrics files of ds_train (ds/runtime/monitor.h): DeepSpeed's csv_monitor layout, resume
// truncation, and an SVG chart that is well-formed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "ds/runtime/monitor.h"

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

}  // namespace
