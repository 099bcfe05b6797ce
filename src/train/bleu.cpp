#include "ds/train/bleu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "ds/core/error.h"

namespace ds::train {

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t hit = s.find(from, at);
    if (hit == std::string::npos) break;
    out.append(s, at, hit - at).append(to);
    at = hit + from.size();
  }
  if (at == 0) return;
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

bool digit(char c) {
  return c >= '0' && c <= '9';
}

// sacrebleu's first expression: ([\{-\~\[-\` -\&\(-\+\:-\@\/]).
bool split_symbol(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return (u >= 0x7B && u <= 0x7E) || (u >= 0x5B && u <= 0x60) || (u >= 0x20 && u <= 0x26) ||
         (u >= 0x28 && u <= 0x2B) || (u >= 0x3A && u <= 0x40) || u == '/';
}

// Bytes of the whitespace character Python's str.split() splits on at s[i], or 0. UTF-8 input;
// the expressions above only ever look at ASCII bytes, so working on bytes gives Python's result
// on code points.
size_t space_at(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
  auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  if (c == 0xC2 && (at(1) == 0x85 || at(1) == 0xA0)) return 2;  // U+0085, U+00A0
  if (c == 0xE1 && at(1) == 0x9A && at(2) == 0x80) return 3;    // U+1680
  if (c == 0xE2 && at(1) == 0x80 &&
      (at(2) <= 0x8A || at(2) == 0xA8 || at(2) == 0xA9 || at(2) == 0xAF))
    return at(2) >= 0x80 ? 3 : 0;                             // U+2000-200A, U+2028, U+2029, U+202F
  if (c == 0xE2 && at(1) == 0x81 && at(2) == 0x9F) return 3;  // U+205F
  if (c == 0xE3 && at(1) == 0x80 && at(2) == 0x80) return 3;  // U+3000
  return 0;
}

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < s.size();) {
    if (const size_t n = space_at(s, i)) {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
      i += n;
    } else {
      cur.push_back(s[i++]);
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

// The right-stripped sentence (Python's str.rstrip()).
std::string_view rstrip(std::string_view s) {
  while (!s.empty()) {
    size_t k = 0;
    for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back)
      if (space_at(s, s.size() - back) == back) k = back;
    if (k == 0) break;
    s.remove_suffix(k);
  }
  return s;
}

using Ngrams = std::map<std::vector<std::string>, int64_t>;

Ngrams ngrams_of(const std::vector<std::string>& w) {
  Ngrams out;
  for (size_t n = 1; n <= 4; ++n)
    for (size_t i = 0; i + n <= w.size(); ++i)
      ++out[std::vector<std::string>(w.begin() + static_cast<std::ptrdiff_t>(i),
                                     w.begin() + static_cast<std::ptrdiff_t>(i + n))];
  return out;
}

}  // namespace

std::string tokenize_13a(std::string_view text) {
  std::string line(text);
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }
  line = " " + line + " ";
  // Each expression as re.sub applies it: leftmost matches, not overlapping.
  std::string a;
  for (char c : line) {
    if (split_symbol(c)) {
      a.push_back(' ');
      a.push_back(c);
      a.push_back(' ');
    } else {
      a.push_back(c);
    }
  }
  auto period = [](char c) { return c == '.' || c == ','; };
  std::string b;  // ([^0-9])([\.,]) -> \1 \2
  for (size_t i = 0; i < a.size();) {
    if (i + 1 < a.size() && !digit(a[i]) && period(a[i + 1])) {
      b += a[i], b += ' ', b += a[i + 1], b += ' ';
      i += 2;
    } else {
      b += a[i++];
    }
  }
  std::string c;  // ([\.,])([^0-9]) -> ' \1 \2'
  for (size_t i = 0; i < b.size();) {
    if (i + 1 < b.size() && period(b[i]) && !digit(b[i + 1])) {
      c += ' ', c += b[i], c += ' ', c += b[i + 1];
      i += 2;
    } else {
      c += b[i++];
    }
  }
  std::string d;  // ([0-9])(-) -> \1 \2
  for (size_t i = 0; i < c.size();) {
    if (i + 1 < c.size() && digit(c[i]) && c[i + 1] == '-') {
      d += c[i], d += ' ', d += '-', d += ' ';
      i += 2;
    } else {
      d += c[i++];
    }
  }
  std::string out;
  for (const std::string& w : split_words(d)) {
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references) {
  DS_CHECK(hypotheses.size() == references.size(),
           "[bleu] {} hypotheses but {} reference lists: give one list per hypothesis",
           hypotheses.size(), references.size());
  BleuScore s;
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    DS_CHECK(!references[i].empty(), "[bleu] hypothesis {} has no reference", i);
    const auto hyp = split_words(tokenize_13a(rstrip(hypotheses[i])));
    Ngrams ref_counts;
    int64_t ref_len = -1, diff = -1;
    const int64_t hyp_len = static_cast<int64_t>(hyp.size());
    for (const std::string& r : references[i]) {
      const auto ref = split_words(tokenize_13a(rstrip(r)));
      for (const auto& [g, n] : ngrams_of(ref)) ref_counts[g] = std::max(ref_counts[g], n);
      const int64_t len = static_cast<int64_t>(ref.size()), d = std::abs(hyp_len - len);
      if (diff == -1 || d < diff || (d == diff && len < ref_len)) {
        diff = d;
        ref_len = len;
      }
    }
    s.sys_len += hyp_len;
    s.ref_len += ref_len;
    for (const auto& [g, n] : ngrams_of(hyp)) {
      const size_t order = g.size() - 1;
      s.total[order] += n;
      const auto it = ref_counts.find(g);
      if (it != ref_counts.end()) s.correct[order] += std::min(n, it->second);
    }
  }
  s.brevity_penalty = 1.0;
  if (s.sys_len < s.ref_len)
    s.brevity_penalty =
        s.sys_len > 0 ? std::exp(1.0 - static_cast<double>(s.ref_len) / s.sys_len) : 0.0;
  if (std::all_of(s.correct.begin(), s.correct.end(), [](int64_t c) { return c == 0; })) return s;
  double smooth = 1.0;
  for (size_t n = 0; n < 4; ++n) {
    if (s.total[n] == 0) break;
    if (s.correct[n] == 0) {
      smooth *= 2;
      s.precisions[n] = 100.0 / (smooth * static_cast<double>(s.total[n]));
    } else {
      s.precisions[n] = 100.0 * static_cast<double>(s.correct[n]) / static_cast<double>(s.total[n]);
    }
  }
  double log_sum = 0.0;
  for (double p : s.precisions) log_sum += p == 0.0 ? -9999999999.0 : std::log(p);
  s.score = s.brevity_penalty * std::exp(log_sum / 4.0);
  return s;
}

}  // namespace ds::train
