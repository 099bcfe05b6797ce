#include "ds/runtime/monitor.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "ds/core/error.h"
#include "ds/core/file_io.h"

namespace ds::runtime {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// CSV monitor

fs::path make_log_dir(const fs::path& output_path, const std::string& job_name) {
  DS_CHECK(!job_name.empty() && job_name != "." && job_name != ".." &&
               job_name.find_first_of("/\\") == std::string::npos,
           "[monitor] job name '{}' must be a plain folder name (no '/' or '\\'): it is created "
           "under {}",
           job_name, output_path.string());
  const fs::path dir = output_path / job_name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "[monitor] cannot create '{}': {}", dir.string(), ec.message());
  return dir;
}

CsvMonitor::CsvMonitor(const fs::path& output_path, const std::string& job_name,
                       std::optional<int64_t> keep_up_to)
    : log_dir_(make_log_dir(output_path, job_name)), keep_up_to_(keep_up_to) {}

std::string CsvMonitor::file_stem(std::string_view event_name) {
  std::string s(event_name);
  std::replace(s.begin(), s.end(), '/', '_');
  std::replace(s.begin(), s.end(), ' ', '_');
  return s;
}

fs::path CsvMonitor::file_of(std::string_view event_name) const {
  return log_dir_ / (file_stem(event_name) + ".csv");
}

std::vector<std::pair<int64_t, double>> CsvMonitor::read(const fs::path& file) {
  std::vector<std::pair<int64_t, double>> rows;
  std::ifstream in(file);
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (header) {
      header = false;
      continue;
    }
    const size_t comma = line.find(',');
    if (comma == std::string::npos) continue;
    try {
      rows.emplace_back(std::stoll(line.substr(0, comma)), std::stod(line.substr(comma + 1)));
    } catch (const std::exception&) {
      // A line cut by a crash mid-write: skip it rather than fail the next run.
    }
  }
  return rows;
}

void CsvMonitor::open_first_time(const fs::path& file, std::string_view header) {
  std::vector<std::pair<int64_t, double>> keep;
  if (keep_up_to_ && fs::exists(file)) {
    for (const auto& r : read(file))
      if (r.first <= *keep_up_to_) keep.push_back(r);
  }
  std::ofstream out(file, std::ios::trunc);
  DS_CHECK(out.good(), "[monitor] cannot write '{}'", file.string());
  out << "step," << header << "\n";
  for (const auto& [s, v] : keep) out << fmt::format("{},{}\n", s, v);
}

void CsvMonitor::write_events(const std::vector<MonitorEvent>& events) {
  for (const auto& e : events) {
    const fs::path file = file_of(e.name);
    if (opened_.insert(file.string()).second) {
      const size_t slash = e.name.rfind('/');
      open_first_time(file, slash == std::string::npos ? e.name : e.name.substr(slash + 1));
    }
    // Open per event, as DeepSpeed does: a crash loses at most the row being written, and
    // another process can follow the files while training runs.
    std::ofstream out(file, std::ios::app);
    DS_CHECK(out.good(), "[monitor] cannot append to '{}'", file.string());
    out << fmt::format("{},{}\n", e.step, e.value);
  }
}

// ---------------------------------------------------------------------------------------------
// SVG chart

namespace {

// Round-number tick spacing (1, 2 or 5 x 10^k) giving about `target` intervals over span.
double nice_step(double span, int target) {
  if (!(span > 0)) return 1.0;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * mag;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-9) v = 0.0;
  const double a = std::fabs(v);
  if (a >= 1e6) return fmt::format("{:.3g}", v);
  if (a >= 1e3 && step >= 1000) return fmt::format("{:.0f}k", v / 1000);
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return fmt::format("{:.{}f}", v, decimals);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string render_svg_chart(const ChartSpec& spec) {
  const double W = spec.width, H = spec.height;
  const double left = 78, right = 24, top = 48, bottom = 64;
  const double pw = W - left - right, ph = H - top - bottom;

  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : spec.series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  for (const auto& l : spec.lines)
    if (std::isfinite(l.y)) y0 = std::min(y0, l.y), y1 = std::max(y1, l.y);
  if (!std::isfinite(x0)) x0 = 0, x1 = 1;
  if (!std::isfinite(y0)) y0 = 0, y1 = 1;
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  // Axes start at round numbers just outside the data.
  const double xs = nice_step(x1 - x0, 8), ys = nice_step(y1 - y0, 6);
  x0 = std::floor(x0 / xs) * xs, x1 = std::ceil(x1 / xs) * xs;
  y0 = std::floor(y0 / ys) * ys, y1 = std::ceil(y1 / ys) * ys;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + (1.0 - (y - y0) / (y1 - y0)) * ph; };

  std::ostringstream o;
  o << fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"13\">\n",
      spec.width, spec.height);
  o << fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  o << fmt::format(
      "<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"17\" "
      "font-weight=\"bold\">{}</text>\n",
      left + pw / 2, xml_escape(spec.title));

  // Grid and tick labels.
  for (double x = x0; x <= x1 + xs * 1e-6; x += xs) {
    o << fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#e5e5e5\"/>\n",
        px(x), top, top + ph);
    o << fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(x),
                     top + ph + 18, tick_label(x, xs));
  }
  for (double y = y0; y <= y1 + ys * 1e-6; y += ys) {
    o << fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#e5e5e5\"/>\n",
        left, py(y), left + pw);
    o << fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 8,
                     py(y) + 4, tick_label(y, ys));
  }
  o << fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left,
      top, pw, ph);
  o << fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                   left + pw / 2, H - 18, xml_escape(spec.x_label));
  o << fmt::format(
      "<text x=\"18\" y=\"{0:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
      "{0:.1f})\">{1}</text>\n",
      top + ph / 2, xml_escape(spec.y_label));

  // Reference lines, then series on top.
  for (const auto& l : spec.lines) {
    if (!std::isfinite(l.y)) continue;
    o << fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
        left, py(l.y), left + pw, l.color);
  }
  for (const auto& s : spec.series) {
    std::string pts;
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    if (pts.empty()) continue;
    o << fmt::format(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
        "stroke-linejoin=\"round\"/>\n",
        pts, s.color);
    if (s.markers)
      for (const auto& [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y))
          o << fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n", px(x),
                           py(y), s.color);
  }

  // Legend, top right inside the plot.
  std::vector<std::tuple<std::string, std::string, bool>> entries;  // label, colour, dashed
  for (const auto& s : spec.series) entries.emplace_back(s.label, s.color, false);
  for (const auto& l : spec.lines) entries.emplace_back(l.label, l.color, true);
  size_t longest = 0;
  for (const auto& e : entries) longest = std::max(longest, std::get<0>(e).size());
  const double lw = 44 + 7.2 * static_cast<double>(longest), lh = 20.0 * entries.size() + 10;
  const double lx = left + pw - lw - 10, ly = top + 10;
  if (!entries.empty())
    o << fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"white\" "
        "fill-opacity=\"0.9\" stroke=\"#bbb\"/>\n",
        lx, ly, lw, lh);
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [label, color, dashed] = entries[i];
    const double y = ly + 18 + 20.0 * i;
    o << fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        lx + 8, y - 4, lx + 34, y - 4, color, dashed ? " stroke-dasharray=\"6 4\"" : "");
    o << fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 40, y, xml_escape(label));
  }
  o << "</svg>\n";
  return o.str();
}

void write_svg_chart(const fs::path& path, const ChartSpec& spec) {
  // Temporary name, fsync, rename; a failed write (full disk) removes its temporary.
  write_file_atomic(path, render_svg_chart(spec));
}

}  // namespace ds::runtime
