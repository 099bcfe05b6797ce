#include "ds/autograd/grad_mode.h"

namespace ds::autograd {
namespace {
thread_local bool g_grad_enabled = true;
}
bool is_grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool enabled) { g_grad_enabled = enabled; }
}  // namespace ds::autograd
