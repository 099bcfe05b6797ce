# The CUDA backend on one GPU (built with -DDS_WITH_CUDA=ON): GEMM, attention and a GPT forward +
# backward step; bench/run_cuda.sh runs it beside PyTorch on the same GPU (bench/RESULTS.md).
if(DS_WITH_CUDA)
  add_executable(bench_cuda ${CMAKE_CURRENT_SOURCE_DIR}/bench_cuda.cpp)
  target_link_libraries(bench_cuda PRIVATE deepspeed)
endif()
