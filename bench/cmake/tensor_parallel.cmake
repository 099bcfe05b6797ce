# Tensor-parallel all-reduce bytes against the formula, and step time against the whole model.
add_executable(bench_tensor_parallel ${CMAKE_CURRENT_SOURCE_DIR}/bench_tensor_parallel.cpp)
target_link_libraries(bench_tensor_parallel PRIVATE deepspeed)
