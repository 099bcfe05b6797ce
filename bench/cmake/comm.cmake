# Collectives: ours (shared-memory path) vs OpenMPI's, and overlap of an async all_reduce with
# computation. Needs the MPI backend. Run: build/bench/bench_comm (re-launches itself under mpirun).
if(DS_HAVE_MPI)
  add_executable(bench_comm ${CMAKE_CURRENT_SOURCE_DIR}/bench_comm.cpp)
  target_link_libraries(bench_comm PRIVATE deepspeed)
  target_compile_definitions(bench_comm PRIVATE DS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
    DS_MPIEXEC_NUMPROC_FLAG="${MPIEXEC_NUMPROC_FLAG}")
endif()
