// Shared checkpoint-folder reading helpers (checkpoint_format.h).
#include "checkpoint_format.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include "ds/core/error.h"

namespace ds::runtime::detail {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

nlohmann::json parse_metadata(const safetensors::Reader& r, const std::string& key,
                              const char* tag) {
  DS_CHECK(r.metadata().count(key), "{} {} has no '{}' metadata: not a deepspeed.cpp checkpoint file",
           tag, r.path(), key);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(r.metadata(key));
  } catch (const std::exception& e) {
    DS_THROW("{} {}: the '{}' metadata is not valid JSON ({}); the file is damaged", tag, r.path(),
             key, e.what());
  }
  DS_CHECK(j.is_object(), "{} {}: the '{}' metadata must be a JSON object, got {}", tag, r.path(),
           key, j.type_name());
  return j;
}

int64_t field_int(const nlohmann::json& j, const std::string& key, const std::string& file,
                  const std::string& where) {
  auto it = j.find(key);
  DS_CHECK(it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0,
           "[ds_to_fp32] {}: {}.{} must be an integer >= 0, got {}; the checkpoint is damaged or "
           "not written by deepspeed.cpp",
           file, where, key, it == j.end() ? std::string("nothing") : it->dump());
  return it->get<int64_t>();
}

std::string hex64(uint64_t v) {
  return fmt::format("{:016x}", v);
}

}  // namespace ds::runtime::detail
