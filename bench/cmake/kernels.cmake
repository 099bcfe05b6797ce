# Non-GEMM kernels at GPT-2 124M shapes against memory bandwidth and sgemm measured in the same run.
add_executable(bench_kernels ${CMAKE_CURRENT_SOURCE_DIR}/bench_kernels.cpp)
target_link_libraries(bench_kernels PRIVATE deepspeed)
