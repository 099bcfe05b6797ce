#pragma once
// The devices the op tests run on, and what a test needs to run one body on any of them (ggml's
// test-backend-ops): the device list for INSTANTIATE_TEST_SUITE_P, readable parameter names, host
// round trips for reading results, and a skip when a backend has no kernel for an op.
//
//   class Ops : public ds::testing::DeviceTest {};  // gradcheck.h
//   TEST_P(Ops, Softmax) {
//     DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "softmax_forward");
//     ...
//   }
//   INSTANTIATE_TEST_SUITE_P(AllDevices, Ops, ::testing::ValuesIn(ds::testing::test_devices()),
//                            ds::testing::device_param_name);
//
// Op names are those of the kernels in ds::backend::Backend (include/ds/backend/backend.h):
// "binary", "unary", "reduce", "gemm", "copy", "layer_norm_forward", "attention_backward", ...
#include <gtest/gtest.h>

#include <cctype>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "ds/backend/backend.h"
#include "ds/core/device.h"
#include "ds/core/dtype.h"
#include "ds/core/tensor.h"

namespace ds {
// GoogleTest prints test parameters with this ("cpu", "sim:0", "cuda:0") instead of their bytes.
inline void PrintTo(const Device& device, std::ostream* os) {
  *os << device.str();
}
}  // namespace ds

namespace ds::testing {

// kCPU and the sim emulator always (sim:0, src/backend/sim: device memory the host cannot
// dereference, the CPU's kernels, so a test that reads device memory on the host crashes there),
// plus the first GPU when the build has the CUDA backend (-DDS_WITH_CUDA=ON) and the machine has
// one: a CUDA build still runs its CPU tests on a machine without a GPU. The CUDA backend runs one
// GPU per process (cuda:0).
inline std::vector<Device> test_devices() {
  std::vector<Device> devices{kCPU, Device{DeviceType::sim, 0}};
  if (backend::cuda_device_count() > 0) devices.push_back(Device{DeviceType::cuda, 0});
  return devices;
}

// "cpu", "sim_0", "cuda_0": GoogleTest parameter names allow only letters, digits and '_'.
inline std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  std::string name = info.param.str();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

// Whether device's backend has a kernel for op at dtype.
inline bool supported(Device device, const char* op, DType dtype) {
  return backend::get(device).supports(op, dtype);
}

// The first of ops that device's backend has no kernel for at dtype; "" when it has them all.
inline std::string first_unsupported(Device device, DType dtype,
                                     std::initializer_list<const char*> ops) {
  for (const char* op : ops)
    if (!supported(device, op, dtype)) return op;
  return "";
}

// t on device (t itself when it is already there). Tensor has no device-transfer API yet, so this
// calls Backend::copy directly, on the non-CPU side's backend: that is the one that can reach both
// memories. On the CPU nothing is copied, so CPU tests see exactly the tensors they made.
inline Tensor to_device(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), device);
  backend::get(device.is_cpu() ? t.device() : device).copy(t, out);
  return out;
}

inline Tensor to_host(const Tensor& t) {
  return to_device(t, kCPU);
}

// t's elements as fp32 on the host, whatever its device (Tensor::to_vector reads host memory).
inline std::vector<float> host_vector(const Tensor& t) {
  return to_host(t).to_vector();
}

}  // namespace ds::testing

// In a test body (or SetUp): skip the test when device's backend lacks a kernel for any of the
// named ops at dtype, e.g. DS_SKIP_UNLESS_SUPPORTED(GetParam(), DType::f32, "rope");
// A macro because GTEST_SKIP() returns from the function it is written in.
#define DS_SKIP_UNLESS_SUPPORTED(device, dtype, ...)                                          \
  do {                                                                                        \
    const ::ds::Device ds_skip_device_ = (device);                                            \
    const ::ds::DType ds_skip_dtype_ = (dtype);                                               \
    const std::string ds_skip_missing_ =                                                      \
        ::ds::testing::first_unsupported(ds_skip_device_, ds_skip_dtype_, {__VA_ARGS__});     \
    if (!ds_skip_missing_.empty())                                                            \
      GTEST_SKIP() << "backend " << ds_skip_device_.str() << " has no \"" << ds_skip_missing_ \
                   << "\" kernel for " << ::ds::dtype_name(ds_skip_dtype_);                   \
  } while (0)
