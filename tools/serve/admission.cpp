// ds_serve's admission limit (admission.h).
#include "admission.h"

#include <fmt/format.h>

#include "ds/serve/api.h"

namespace ds::serve {

Admission::Slot Admission::admit() {
  int cur = admitted_.load();
  do {
    if (cur >= max_batch_ + max_queue_)
      throw ApiError(503,
                     fmt::format("the server is busy: {} request{} generating or waiting, the "
                                 "limit is --max_batch {} + --max_queue {}; retry later",
                                 cur, cur == 1 ? " is" : "s are", max_batch_, max_queue_),
                     "", "server_busy");
  } while (!admitted_.compare_exchange_weak(cur, cur + 1));
  return Slot(static_cast<void*>(this), [](void* p) { static_cast<Admission*>(p)->admitted_--; });
}

}  // namespace ds::serve
