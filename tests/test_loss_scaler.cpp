// The loss-scaler state machine (§5), driven by injected overflow sequences: DeepSpeed's own
// DynamicLossScaler trajectories (fixture from tests/fixtures/generators/gen_schedule_fixture.py), then each rule on
// its own: hysteresis, growth after the window, consecutive_hysteresis, the minimum-scale error,
// static scale, checkpoint state, and the fused unscale/clip coefficient.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "ds/core/error.h"
#include "ds/config/config.h"
#include "ds/runtime/loss_scaler.h"

using namespace ds;
using namespace ds::runtime;
using nlohmann::json;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

// Drives the scaler with a pattern like "0010" (1 = overflow); returns the scales after each.
std::vector<double> run(LossScaler& s, std::string_view pattern) {
  std::vector<double> out;
  for (char c : pattern) out.push_back(s.update(c == '1').scale);
  return out;
}

}  // namespace

TEST(LossScaler, MatchesDeepSpeedFixture) {
  std::ifstream in(std::string(DS_FIXTURE_DIR) + "/config/loss_scaler.json");
  ASSERT_TRUE(in.good());
  json fx = json::parse(in);
  ASSERT_GE(fx["cases"].size(), 6u);
  for (const auto& c : fx["cases"]) {
    const std::string name = c["name"];
    LossScaler s(c["init_scale"], c["scale_window"], c["hysteresis"], c["min_scale"],
                 c["consecutive_hysteresis"]);
    std::vector<std::string> sunk;
    s.set_log_sink([&](const std::string& m) { sunk.push_back(m); });
    const std::string pattern = c["overflow"];
    const bool errors = !c["error_at"].is_null();
    const size_t n = errors ? c["error_at"].get<size_t>() : pattern.size();
    for (size_t i = 0; i < n; ++i) {
      auto u = s.update(pattern[i] == '1');
      EXPECT_EQ(u.skip_step, pattern[i] == '1') << name << " step " << i;
      EXPECT_EQ(u.scale, c["scale"][i].get<double>()) << name << " step " << i;
      EXPECT_EQ(s.cur_hysteresis(), c["cur_hysteresis"][i].get<int>()) << name << " step " << i;
      EXPECT_EQ(u.message, c["log"][i].get<std::string>()) << name << " step " << i;
    }
    if (errors) {
      std::string msg = error_of([&] { s.update(pattern[n] == '1'); });
      EXPECT_NE(msg.find(c["log"][n].get<std::string>()), std::string::npos) << name << ": " << msg;
    }
    size_t logged = 0;
    for (size_t i = 0; i < n; ++i) logged += !c["log"][i].get<std::string>().empty();
    EXPECT_EQ(sunk.size(), logged) << name;
  }
}

TEST(LossScaler, HysteresisDelaysTheDecrease) {
  LossScaler s(1024, 1000, /*hysteresis=*/3, 1, false);
  auto u = s.update(true);
  EXPECT_TRUE(u.skip_step);
  EXPECT_EQ(u.scale, 1024);
  EXPECT_EQ(u.message,
            "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, but hysteresis is 3. "
            "Reducing hysteresis to 2");
  EXPECT_EQ(s.update(true).scale, 1024);
  u = s.update(true);
  EXPECT_EQ(u.scale, 512);
  EXPECT_EQ(u.message,
            "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512");
  // Hysteresis is spent: every further overflow halves until a window refills it.
  EXPECT_EQ(s.update(true).scale, 256);
  EXPECT_EQ(s.last_overflow_iter(), 3);
}

TEST(LossScaler, GrowsAfterWindowCleanSteps) {
  LossScaler s(65536, /*window=*/4, 2, 1, false);
  // last_overflow starts at -1: the first growth comes after exactly W clean steps.
  EXPECT_EQ(run(s, "0000"), (std::vector<double>{65536, 65536, 65536, 131072}));
  EXPECT_EQ(run(s, "0000"), (std::vector<double>{131072, 131072, 131072, 262144}));
  EXPECT_EQ(s.update(false).message, "");
  // After an overflow the window restarts from that iteration.
  LossScaler t(8, 3, 1, 1, false);
  EXPECT_EQ(run(t, "1000000"), (std::vector<double>{4, 4, 4, 8, 8, 8, 16}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  // Without consecutive_hysteresis, isolated overflows drain the hysteresis until a window passes.
  LossScaler plain(256, 100, 2, 1, false);
  EXPECT_EQ(run(plain, "10101"), (std::vector<double>{256, 256, 128, 128, 64}));
  // With it, one clean step in between restores it, so isolated overflows never cut the scale.
  LossScaler consec(256, 100, 2, 1, true);
  EXPECT_EQ(run(consec, "10101"), (std::vector<double>{256, 256, 256, 256, 256}));
  EXPECT_EQ(consec.cur_hysteresis(), 1);
  EXPECT_EQ(run(consec, "11"), (std::vector<double>{128, 64}));
}

TEST(LossScaler, MinimumScaleIsAnError) {
  LossScaler s(4, 1000, 1, /*min_scale=*/1, false);
  EXPECT_EQ(run(s, "11"), (std::vector<double>{2, 1}));
  std::string msg = error_of([&] { s.update(true); });
  EXPECT_NE(msg.find("Current loss scale already at minimum - cannot decrease scale anymore"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.rfind("[loss_scaler]", 0), 0u) << msg;
  // Non-power-of-two minimum: clamps to it first, errors on the next overflow.
  LossScaler m(10, 1000, 1, 3, false);
  EXPECT_EQ(run(m, "11"), (std::vector<double>{5, 3}));
  EXPECT_EQ(s.scale(), 1);
  EXPECT_THROW(m.update(true), ds::Error);
}

TEST(LossScaler, StaticScaleNeverChanges) {
  config::FP16Config fp16;
  fp16.enabled = true;
  fp16.loss_scale = 128;
  LossScaler s = LossScaler::from_config(fp16);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(run(s, "0000000011110000"), std::vector<double>(16, 128.0));
  auto u = s.update(true);
  EXPECT_TRUE(u.skip_step);  // our rule: non-finite gradients never reach the weights
  EXPECT_EQ(u.message, "OVERFLOW! Rank 0 Skipping step. Static loss scale: 128, not changed");
  EXPECT_EQ(s.consecutive_overflows(), 1);
  EXPECT_EQ(s.update(false).message, "");
  EXPECT_EQ(s.consecutive_overflows(), 0);
}

TEST(LossScaler, FromConfig) {
  config::FP16Config off;
  LossScaler none = LossScaler::from_config(off);
  EXPECT_FALSE(none.dynamic());
  EXPECT_EQ(none.scale(), 1.0);

  auto cfg = config::parse_config(R"({"train_batch_size": 8, "fp16": {"enabled": true}})");
  LossScaler d = LossScaler::from_config(cfg.fp16);
  EXPECT_TRUE(d.dynamic());
  EXPECT_EQ(d.scale(), 65536.0);  // documented defaults: 2^16, hysteresis 2 (not DeepSpeed's 2^32)
  EXPECT_EQ(d.cur_hysteresis(), 2);

  auto cfg2 = config::parse_config(
      R"({"train_batch_size": 8, "fp16": {"enabled": true, "initial_scale_power": 12,
          "loss_scale_window": 2, "hysteresis": 1, "min_loss_scale": 1024}})");
  LossScaler e = LossScaler::from_config(cfg2.fp16);
  EXPECT_EQ(run(e, "00111"), (std::vector<double>{4096, 8192, 4096, 2048, 1024}));
  EXPECT_THROW(e.update(true), ds::Error);
}

TEST(LossScaler, RankAppearsInMessage) {
  LossScaler s(64, 10, 1, 1, false);
  s.set_rank(3);
  EXPECT_EQ(s.update(true).message,
            "OVERFLOW! Rank 3 Skipping step. Attempted loss scale: 64, reducing to 32");
}

TEST(LossScaler, StateSaveLoadResumesExactly) {
  LossScaler a(1 << 20, 5, 2, 1, false);
  run(a, "0100100000001");
  json state = json::parse(a.state_dict().dump());
  LossScaler b(1 << 20, 5, 2, 1, false);
  b.load_state_dict(state);
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.cur_iter(), a.cur_iter());
  EXPECT_EQ(b.last_overflow_iter(), a.last_overflow_iter());
  EXPECT_EQ(b.cur_hysteresis(), a.cur_hysteresis());
  const std::string rest = "0000010111000000000010000000";
  EXPECT_EQ(run(a, rest), run(b, rest));
  EXPECT_THROW(b.load_state_dict(json{{"cur_iter", 3}}), ds::Error);
  // A static scaler keeps its configured scale when loading a dynamic state.
  LossScaler st = LossScaler::make_static(8);
  st.load_state_dict(state);
  EXPECT_EQ(st.scale(), 8);
}

TEST(LossScaler, ClipCoefficient) {
  // No clipping: just unscale.
  auto c = unscale_and_clip_coefficient(1000.0, 1024.0, 0.0);
  EXPECT_EQ(c.k, 1.0);
  EXPECT_EQ(c.factor, 1.0 / 1024.0);
  // Unscaled norm 0.5 below clip 1.0: not clipped.
  c = unscale_and_clip_coefficient(512.0, 1024.0, 1.0);
  EXPECT_FALSE(c.clipped());
  EXPECT_EQ(c.factor, 1.0 / 1024.0);
  // Unscaled norm 4 with clip 1: k = (4 + 1e-6) / 1, factor = 1 / (k * scale).
  c = unscale_and_clip_coefficient(4096.0, 1024.0, 1.0);
  EXPECT_TRUE(c.clipped());
  EXPECT_DOUBLE_EQ(c.k, 4.000001);
  EXPECT_DOUBLE_EQ(c.factor, 1.0 / (4.000001 * 1024.0));
  // The clipped gradient norm is c * norm / (norm + 1e-6): just under the threshold.
  EXPECT_LT(4096.0 * c.factor, 1.0);
  EXPECT_NEAR(4096.0 * c.factor, 1.0, 1e-6);
  EXPECT_THROW(unscale_and_clip_coefficient(std::numeric_limits<double>::infinity(), 1024, 1),
               ds::Error);
  EXPECT_THROW(unscale_and_clip_coefficient(std::nan(""), 1024, 1), ds::Error);
}

TEST(LossScaler, InvalidSettingsRejected) {
  EXPECT_THROW(LossScaler(0, 10, 1, 1, false), ds::Error);
  EXPECT_THROW(LossScaler(8, 0, 1, 1, false), ds::Error);
  EXPECT_THROW(LossScaler(8, 10, 0, 1, false), ds::Error);
  EXPECT_THROW(LossScaler::make_static(-1), ds::Error);
}
