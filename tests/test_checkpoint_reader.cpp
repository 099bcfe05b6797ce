// runtime::CheckpointReader, the one reader of a checkpoint folder that resume and ds_to_fp32
// share: folder/tag resolution (`latest`, an explicit tag, the tag folder itself), checksum
// verification naming the damaged file in each use's wording, the model-states metadata and the
// optimizer shard list. The checkpoint is written by hand (no engine), so each field is known.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/safetensors.h"
#include "ds/runtime/checkpoint_reader.h"

using namespace ds;
namespace fs = std::filesystem;
using Use = runtime::CheckpointReader::Use;

namespace {

constexpr const char* kModel = "mp_rank_00_model_states.safetensors";
constexpr const char* kShard = "zero_pp_rank_0_mp_rank_00_optim_states.safetensors";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class CheckpointReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("ds_ckpt_reader_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    write(nlohmann::json::object());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // dir_/global_step7: a model file with ds_engine `extra` merged in, one optimizer shard, the
  // checksums of both; dir_/latest names it.
  void write(const nlohmann::json& extra) {
    const fs::path ck = dir_ / "global_step7";
    fs::create_directories(ck);
    nlohmann::json engine = {{"global_steps", 7},
                             {"world_size", 2},
                             {"zero_stage", 3},
                             {"dtype", "fp16"},
                             {"client_state", {{"ds_train", {{"model", {{"n_layer", 2}}}}}}}};
    engine.update(extra);
    const Tensor w = Tensor::zeros({2, 3}, DType::f32);
    safetensors::save((ck / kModel).string(), {{"w", w}}, {{"ds_engine", engine.dump()}});
    safetensors::save((ck / kShard).string(), {{"fp32_master", w}},
                      {{"ds_optimizer", R"({"numel": 6})"}});
    nlohmann::json sums = nlohmann::json::object();
    for (const char* f : {kModel, kShard}) {
      uint64_t size = 0;
      const uint64_t h = file_xxh64(ck / f, &size);
      sums[f] = {{"bytes", size}, {"xxh64", fmt::format("{:016x}", h)}};
    }
    std::ofstream(ck / "checksums.json") << sums.dump();
    std::ofstream(dir_ / "latest") << "global_step7\n";
  }
  fs::path dir_;
};

TEST_F(CheckpointReaderTest, ResolvesLatestATagAndTheTagFolder) {
  const fs::path ck = dir_ / "global_step7";
  EXPECT_EQ(runtime::CheckpointReader(dir_, "", Use::Resume).folder(), ck);
  EXPECT_EQ(runtime::CheckpointReader(dir_, "global_step7", Use::Resume).folder(), ck);
  EXPECT_EQ(runtime::CheckpointReader(dir_, "", Use::Consolidate).folder(), ck);
  // ds_to_fp32 also takes the tag folder itself; resume wants the run folder and `latest`.
  EXPECT_EQ(runtime::CheckpointReader(ck, "", Use::Consolidate).folder(), ck);
  std::string err = error_of([&] { runtime::CheckpointReader r(ck, "", Use::Resume); });
  EXPECT_NE(err.find("[checkpoint] " + ck.string() + " has no 'latest' file"), std::string::npos)
      << err;
  // A tag is a folder name, never a path.
  err = error_of([&] { runtime::CheckpointReader r(dir_, "../x", Use::Resume); });
  EXPECT_NE(err.find("must be a folder name inside the checkpoint folder"), std::string::npos)
      << err;
  err = error_of([&] { runtime::CheckpointReader r(dir_, "global_step9", Use::Consolidate); });
  EXPECT_NE(err.find("[ds_to_fp32] checkpoint folder"), std::string::npos) << err;
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
  // The rank is named when the folder is missing in a multi-rank job.
  err = error_of([&] { runtime::CheckpointReader r(dir_ / "none", "", Use::Resume, 3); });
  EXPECT_NE(err.find("is not a folder on rank 3"), std::string::npos) << err;
}

TEST_F(CheckpointReaderTest, ReadsTheModelStatesMetadata) {
  runtime::CheckpointReader r(dir_, "", Use::Consolidate);
  EXPECT_EQ(r.global_steps(), 7);
  EXPECT_EQ(r.world_size(), 2);
  EXPECT_EQ(r.zero_stage(), 3);
  EXPECT_EQ(r.training_dtype(), DType::f16);
  EXPECT_EQ(r.model_parallel(), std::make_pair(1, 1));
  ASSERT_TRUE(r.model_config().has_value());
  EXPECT_EQ((*r.model_config())["n_layer"], 2);
  EXPECT_TRUE(r.model_file().contains("w"));
  const auto shards = r.optimizer_files(false);
  ASSERT_EQ(shards.size(), 1u);
  EXPECT_EQ(shards.at(0).at(0), kShard);
  EXPECT_TRUE(r.optimizer_files(true).empty());  // bf16 runs name theirs bf16_zero_pp_rank_...
  // A shard on disk that checksums.json does not list: ds_to_fp32 names it (verify then refuses
  // it), resume goes by checksums.json only.
  const std::string unlisted = "zero_pp_rank_1_mp_rank_00_optim_states.safetensors";
  std::ofstream(dir_ / "global_step7" / unlisted) << "x";
  EXPECT_EQ(
      runtime::CheckpointReader(dir_, "", Use::Consolidate).optimizer_files(false).at(0).at(1),
      unlisted);
  EXPECT_EQ(runtime::CheckpointReader(dir_, "", Use::Resume).optimizer_files(false).at(0).size(),
            1u);
  fs::remove(dir_ / "global_step7" / unlisted);

  write({{"model_parallel", {{"tp", 2}, {"pp", 2}}}, {"global_steps", -1}});
  runtime::CheckpointReader resume(dir_, "", Use::Resume);
  EXPECT_EQ(resume.model_parallel(), std::make_pair(2, 2));
  EXPECT_EQ(resume.client_state()["ds_train"]["model"]["n_layer"], 2);
  // A field of the wrong value is named with the file, in each use's wording.
  std::string err = error_of([&] { resume.global_steps(); });
  EXPECT_NE(err.find("[checkpoint] " + (dir_ / "global_step7" / kModel).string() +
                     ": ds_engine.global_steps must be an integer >= 0"),
            std::string::npos)
      << err;
  err = error_of([&] { runtime::CheckpointReader(dir_, "", Use::Consolidate).global_steps(); });
  EXPECT_NE(err.find("[ds_to_fp32] " + (dir_ / "global_step7" / kModel).string() +
                     ": ds_engine.global_steps must be an integer >= 0, got -1"),
            std::string::npos)
      << err;
}

TEST_F(CheckpointReaderTest, ACorruptFileIsNamed) {
  const fs::path shard = dir_ / "global_step7" / kShard;
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    f.put('\x7f');
  }
  for (Use use : {Use::Resume, Use::Consolidate}) {
    runtime::CheckpointReader r(dir_, "", use);
    EXPECT_EQ(error_of([&] { r.verify(kModel); }), "(no error)");
    const std::string err = error_of([&] { r.verify(kShard); });
    EXPECT_NE(err.find(std::string(r.tag()) + " " + shard.string() + " is corrupted: checksum"),
              std::string::npos)
        << err;
  }
  fs::resize_file(shard, fs::file_size(shard) - 2);
  runtime::CheckpointReader r(dir_, "", Use::Consolidate);
  const std::string err = error_of([&] { r.verify(kShard); });
  EXPECT_NE(err.find("[ds_to_fp32] " + shard.string() + " is truncated or padded"),
            std::string::npos)
      << err;

  // checksums.json itself.
  std::ofstream(dir_ / "global_step7" / "checksums.json") << "{";
  const std::string bad = error_of([&] { runtime::CheckpointReader c(dir_, "", Use::Resume); });
  EXPECT_NE(bad.find("[checkpoint] " + (dir_ / "global_step7" / "checksums.json").string() +
                     " is corrupted"),
            std::string::npos)
      << bad;
}

}  // namespace
