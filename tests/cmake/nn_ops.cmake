# Neural-network ops and their kernels (src/ops/nn.cpp, src/backend/cpu/nn_kernels.cpp,
# src/backend/cpu/attention.cpp), run on every backend: the device list and the supports() skip are
# in tests/devices.h.
ds_add_test(test_gradcheck_nn LABELS gradcheck SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gradcheck_nn.cpp)
ds_add_test(test_ops LABELS core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ops.cpp)
# test_ops checks fast_math.h (an internal CPU-backend header) compiled the way the library compiles it.
target_include_directories(test_ops PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(test_ops PRIVATE ${DS_ARCH_FLAGS})
