// The safetensors reader and writer: round trips, and clear errors (naming the file) for damaged
// files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ds/core/error.h"
#include "ds/core/safetensors.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ds_safetensors_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
  }
  static void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // A file whose header is exactly `json` (no padding) followed by `data`.
  static std::string make_file(const std::string& json, const std::string& data) {
    std::string out(8, '\0');
    const uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
    return out + json + data;
  }

  // The error message of f(), which must throw ds::Error.
  template <class F>
  static std::string error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a ds::Error";
    return "";
  }

  fs::path dir_;
};

}  // namespace

TEST_F(Safetensors, RoundTripsAllDtypesAndMetadata) {
  const std::string path = file("all.safetensors");
  Tensor f32 = Tensor::from_data({1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 65504.0f}, {2, 3});
  Tensor bf = Tensor::from_data({1.0f, -0.5f, 3.140625f, 256.0f}, {4}, DType::bf16);
  Tensor hf = Tensor::from_data({0.099975586f, -1.0f}, {1, 2}, DType::f16);
  Tensor i32 = Tensor::from_ints({-7, 0, 2147483647}, {3}, DType::i32);
  Tensor i64 = Tensor::from_ints({-100, int64_t{1} << 40}, {2, 1}, DType::i64);
  Tensor scalar = Tensor::from_data({42.0f}, {});
  Tensor empty = Tensor::empty({0, 4});
  safetensors::save(path,
                    {{"f32", f32},
                     {"bf16", bf},
                     {"f16", hf},
                     {"i32", i32},
                     {"i64", i64},
                     {"scalar", scalar},
                     {"empty", empty}},
                    {{"format", "pt"}, {"config", "{\"n_layer\": 2}"}});

  // The data region starts 8-byte aligned.
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');

  safetensors::Reader r(path);
  EXPECT_EQ(r.names(),
            (std::vector<std::string>{"f32", "bf16", "f16", "i32", "i64", "scalar", "empty"}));
  EXPECT_EQ(r.metadata("format"), "pt");
  EXPECT_EQ(r.metadata("config"), "{\"n_layer\": 2}");
  auto expect_same = [&](const char* name, const Tensor& want) {
    Tensor got = r.get(name);
    EXPECT_EQ(got.dtype(), want.dtype()) << name;
    EXPECT_EQ(got.shape(), want.shape()) << name;
    ASSERT_EQ(got.nbytes(), want.nbytes()) << name;
    if (want.nbytes())
      EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << name;
  };
  expect_same("f32", f32);
  expect_same("bf16", bf);
  expect_same("f16", hf);
  expect_same("i32", i32);
  expect_same("i64", i64);
  expect_same("scalar", scalar);
  expect_same("empty", empty);
  EXPECT_EQ(r.entry("bf16").dtype_name, "BF16");

  // read_into converts: a BF16 tensor into fp32 weights.
  Tensor dst = Tensor::zeros({4});
  r.read_into("bf16", dst);
  EXPECT_EQ(dst.to_vector(), bf.to_vector());

  auto all = safetensors::load(path);
  EXPECT_EQ(all.size(), 7u);
  EXPECT_EQ(all.at("i64").to_int_vector(), (std::vector<int64_t>{-100, int64_t{1} << 40}));
}

TEST_F(Safetensors, WritesNonContiguousTensorsAsTheirValues) {
  const std::string path = file("t.safetensors");
  Tensor a = Tensor::from_data({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor at = Tensor::from_storage(a.storage(), {3, 2}, DType::f32, 0, {1, 3});  // transpose view
  safetensors::save(path, {{"at", at}});
  EXPECT_EQ(safetensors::Reader(path).get("at").to_vector(),
            (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST_F(Safetensors, SaveIsAtomicAndLeavesNoTemporary) {
  const std::string path = file("w.safetensors");
  safetensors::save(path, {{"x", Tensor::ones({3})}});
  safetensors::save(path, {{"y", Tensor::zeros({2})}});  // replaces
  safetensors::Reader r(path);
  EXPECT_FALSE(r.contains("x"));
  EXPECT_TRUE(r.contains("y"));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
  // Writing into a folder that does not exist fails with the path in the message.
  const std::string bad = file("no/such/dir/x.safetensors");
  EXPECT_NE(error_of([&] {
              safetensors::save(bad, {{"x", Tensor::ones({1})}});
            }).find(bad),
            std::string::npos);
}

TEST_F(Safetensors, TruncatedFilesNameTheFile) {
  const std::string path = file("trunc.safetensors");
  safetensors::save(path, {{"w", Tensor::ones({64})}});
  const std::string good = read_bytes(path);

  write_bytes(path, good.substr(0, 5));  // not even the length
  std::string msg = error_of([&] { safetensors::Reader r(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  write_bytes(path, good.substr(0, 20));  // header cut short
  msg = error_of([&] { safetensors::Reader r(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  write_bytes(path, good.substr(0, good.size() - 4));  // data cut short
  msg = error_of([&] { safetensors::Reader r(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;

  const std::string missing = file("missing.safetensors");
  msg = error_of([&] { safetensors::Reader r(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
}

TEST_F(Safetensors, CorruptedHeadersNameTheFile) {
  const std::string path = file("bad.safetensors");
  const std::string data(16, '\0');
  auto expect_corrupt = [&](const std::string& json, const std::string& also) {
    write_bytes(path, make_file(json, data));
    const std::string msg = error_of([&] { safetensors::Reader r(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("corrupted header"), std::string::npos) << msg;
    EXPECT_NE(msg.find(also), std::string::npos) << msg;
  };
  expect_corrupt("{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]", "JSON");
  expect_corrupt("[1, 2]", "object");
  expect_corrupt("{\"w\": {\"dtype\": \"F32\", \"shape\": [4]}}", "data_offsets");
  expect_corrupt("{\"w\": {\"dtype\": \"F33\", \"shape\": [4], \"data_offsets\": [0, 16]}}", "F33");
  expect_corrupt("{\"w\": {\"dtype\": \"F32\", \"shape\": [5], \"data_offsets\": [0, 16]}}", "'w'");
  expect_corrupt("{\"w\": {\"dtype\": \"F32\", \"shape\": \"x\", \"data_offsets\": [0, 16]}}", "");
  expect_corrupt("{\"__metadata__\": {\"k\": 3}}", "metadata");

  // A header length beyond any sane size (e.g. a file of another format).
  std::string junk = "\xff\xff\xff\xff\xff\xff\xff\x7f" + std::string(64, 'x');
  write_bytes(path, junk);
  const std::string msg = error_of([&] { safetensors::Reader r(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST_F(Safetensors, MissingTensorAndUnsupportedDtypeNameTheFile) {
  const std::string path = file("m.safetensors");
  // An F64 tensor next to an F32 one: the file opens, the F32 tensor reads, the F64 one is refused.
  const std::string json =
      "{\"d\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]},"
      " \"f\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}";
  std::string data(16, '\0');
  const float two[2] = {1.0f, 2.0f};
  std::memcpy(data.data() + 8, two, 8);
  write_bytes(path, make_file(json, data));
  safetensors::Reader r(path);
  EXPECT_EQ(r.get("f").to_vector(), (std::vector<float>{1.0f, 2.0f}));
  std::string msg = error_of([&] { r.get("d"); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("F64"), std::string::npos) << msg;
  msg = error_of([&] { r.get("nope"); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'nope'"), std::string::npos) << msg;
  msg = error_of([&] { r.metadata("config"); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  msg = error_of([&] { r.read_into("f", Tensor::zeros({3})); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

// Python's safetensors refuses these ("invalid offset", "incomplete metadata"); a reader that
// accepted them would load one tensor from another's bytes.
TEST_F(Safetensors, TensorsMustTileTheDataWithoutOverlapsOrGaps) {
  const std::string path = file("tiles.safetensors");
  auto error_for = [&](const std::string& json, size_t data_bytes) {
    write_bytes(path, make_file(json, std::string(data_bytes, '\0')));
    return error_of([&] { safetensors::Reader r(path); });
  };
  // b reads a's bytes.
  std::string msg = error_for(
      R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
      R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
      16);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid offset"), std::string::npos) << msg;
  EXPECT_NE(msg.find("overlaps"), std::string::npos) << msg;
  // Two tensors on the same bytes.
  msg = error_for(
      R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
      R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
      16);
  EXPECT_NE(msg.find("overlaps"), std::string::npos) << msg;
  // A hole before the first tensor, and bytes after the last.
  msg = error_for(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 16);
  EXPECT_NE(msg.find("gap"), std::string::npos) << msg;
  msg = error_for(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 16);
  EXPECT_NE(msg.find("incomplete metadata"), std::string::npos) << msg;
  // A shape whose byte count overflows 64 bits.
  msg = error_for(
      R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})", 16);
  EXPECT_NE(msg.find("too large"), std::string::npos) << msg;
  // Out of header order but tiling the data: fine, and each reads its own bytes.
  std::string data(12, '\0');
  data[0] = 1, data[4] = 2;
  write_bytes(path, make_file(R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},)"
                              R"( "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                              data));
  safetensors::Reader r(path);
  EXPECT_EQ(r.entry("a").begin, 0u);
  EXPECT_EQ(r.entry("b").begin, 4u);
}
