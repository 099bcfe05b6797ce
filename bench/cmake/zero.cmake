# ZeRO stages 0-3 on 2 ranks against PyTorch DDP / ZeroRedundancyOptimizer (bench/torch_ddp.py):
# tokens/s, model-state bytes, peak RSS per rank, and the largest micro-batch under a memory cap.
# Needs the MPI backend. Run: bench/run_zero_bench.sh (results in bench/RESULTS.md).
if(DS_HAVE_MPI)
  add_executable(bench_zero ${CMAKE_CURRENT_SOURCE_DIR}/bench_zero.cpp)
  target_link_libraries(bench_zero PRIVATE deepspeed)
endif()
