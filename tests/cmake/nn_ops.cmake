# Neural-network ops and their kernels (src/ops/nn.cpp, src/backend/cpu/nn_kernels.cpp,
# src/backend/cpu/attention.cpp), run on every backend: the device list and the supports() skip are
# in tests/devices.h.
ds_add_test(test_gradcheck_nn LABELS gradcheck SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gradcheck_nn.cpp)
ds_add_test(test_ops LABELS core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ops.cpp)
# test_ops checks fast_math.h (an internal CPU-backend header) compiled the way the library compiles it.
target_include_directories(test_ops PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(test_ops PRIVATE ${DS_ARCH_FLAGS})
# How fp16 GEMMs run is chosen once per process (DS_FP16_GEMM): the GEMM tests again with oneDNN's
# fp16 kernel asked for (used where the CPU has fp16 units, the reason said where not) and refused,
# and an unknown value refused by name.
foreach(mode onednn convert)
  add_test(NAME gemm_fp16_${mode} COMMAND test_ops --gtest_filter=GemmCpu.*)
  set_tests_properties(gemm_fp16_${mode} PROPERTIES LABELS core ENVIRONMENT DS_FP16_GEMM=${mode})
endforeach()
add_test(NAME gemm_fp16_unknown COMMAND test_ops --gtest_filter=GemmCpu.Fp16*)
set_tests_properties(gemm_fp16_unknown PROPERTIES LABELS core ENVIRONMENT DS_FP16_GEMM=fast
  PASS_REGULAR_EXPRESSION "DS_FP16_GEMM=fast is not one of auto, onednn, convert")
