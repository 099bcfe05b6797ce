# The 1-bit optimizers against AdamW on N ranks: bytes per step after the freeze (comms_logger) and
# step time, measured in the same run. Needs the MPI backend. Results in bench/RESULTS.md.
if(DS_HAVE_MPI)
  add_executable(bench_onebit ${CMAKE_CURRENT_SOURCE_DIR}/bench_onebit.cpp)
  target_link_libraries(bench_onebit PRIVATE deepspeed)
endif()
