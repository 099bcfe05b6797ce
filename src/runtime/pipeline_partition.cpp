// Layer-to-stage partitioning (ds/runtime/pipeline_partition.h).
#include "ds/runtime/pipeline_partition.h"

#include <algorithm>
#include <limits>
#include <regex>

#include "ds/core/error.h"

namespace ds::runtime {

std::vector<int64_t> partition_uniform(int64_t num_items, int num_parts) {
  DS_CHECK(num_parts >= 1 && num_items >= 0, "[pipeline] cannot cut {} layers into {} stages",
           num_items, num_parts);
  std::vector<int64_t> parts(static_cast<size_t>(num_parts) + 1);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[static_cast<size_t>(p)] = std::min<int64_t>(p, num_items);
    return parts;
  }
  const int64_t chunk = num_items / num_parts, residual = num_items - chunk * num_parts;
  for (int p = 0; p <= num_parts; ++p)
    parts[static_cast<size_t>(p)] = p * chunk + std::min<int64_t>(p, residual);
  return parts;
}

std::vector<int64_t> partition_balanced(const std::vector<double>& weights, int num_parts) {
  const int64_t n = static_cast<int64_t>(weights.size());
  const int64_t m = num_parts;
  if (n <= m) return partition_uniform(n, num_parts);
  constexpr double inf = std::numeric_limits<double>::infinity();
  const size_t W = static_cast<size_t>(m + 1);
  std::vector<double> dp_max((n + 1) * W, inf), dp_min((n + 1) * W, inf), dp_cost((n + 1) * W, inf);
  std::vector<int64_t> position((n + 1) * W, 0);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[static_cast<size_t>(i)];
  auto at = [&](int64_t i, int64_t j) { return static_cast<size_t>(i) * W + static_cast<size_t>(j); };
  dp_max[at(0, 0)] = 0;
  dp_cost[at(0, 0)] = 0;
  for (int64_t i = 1; i <= n; ++i)
    for (int64_t j = 1; j <= std::min(i, m); ++j)
      for (int64_t k = 0; k < i; ++k) {
        const double part = prefix[i] - prefix[k];
        const double mx = std::max(dp_max[at(k, j - 1)], part);
        const double mn = std::min(dp_min[at(k, j - 1)], part);
        const double cost = mx - mn;
        if (dp_cost[at(i, j)] >= cost) {  // ">=": the last k of equal cost wins, as DeepSpeed's
          dp_cost[at(i, j)] = cost;
          dp_max[at(i, j)] = mx;
          dp_min[at(i, j)] = mn;
          position[at(i, j)] = k;
        }
      }
  std::vector<int64_t> parts = {n};
  for (int64_t j = m; j >= 1; --j) parts.push_back(position[at(parts.back(), j)]);
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<int64_t> partition_layers(const std::vector<PipeLayer>& layers, int num_stages,
                                      const std::string& method) {
  const std::string lower = [&] {
    std::string s = method;
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
  }();
  if (lower == "uniform") return partition_uniform(static_cast<int64_t>(layers.size()), num_stages);
  std::vector<double> w;
  if (lower == "parameters") {
    for (const auto& l : layers) w.push_back(static_cast<double>(l.num_parameters));
  } else if (lower.rfind("type:", 0) == 0) {
    const std::string pattern = method.substr(5);
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::icase | std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      DS_THROW("[pipeline] partition_method '{}': '{}' is not a valid regular expression ({})",
               method, pattern, e.what());
    }
    bool any = false;
    for (const auto& l : layers) {
      const bool hit = std::regex_search(l.type_name, re);
      any = any || hit;
      w.push_back(hit ? 1.0 : 0.0);
    }
    DS_CHECK(any, "[pipeline] Partitioning '{}' found no valid layers to partition (layer types: "
             "{})", pattern, [&] {
               std::string names;
               for (const auto& l : layers)
                 if (names.find(l.type_name) == std::string::npos)
                   names += (names.empty() ? "" : ", ") + l.type_name;
               return names;
             }());
  } else {
    DS_THROW("[pipeline] Partitioning method {} not implemented; use parameters, uniform or "
             "type:<regex>",
             method);
  }
  return partition_balanced(w, num_stages);
}

}  // namespace ds::runtime
