# Collectives (src/comm). test_comm runs three ways: plain (the size-1 group, plus the failure
# drivers that start mpirun on comm_worker themselves and check that a late or killed rank ends the
# job with a message naming it), and under mpirun with 2 and 4 ranks, on the shared-memory path and
# with DS_COMM_SHM=0 on MPI's own collectives. CI has 2 cores and runs as root: --oversubscribe
# and --allow-run-as-root. Label: distributed.
add_executable(test_comm ${CMAKE_CURRENT_SOURCE_DIR}/test_comm.cpp)
target_link_libraries(test_comm PRIVATE deepspeed GTest::gtest)
add_executable(comm_worker ${CMAKE_CURRENT_SOURCE_DIR}/comm_worker.cpp)
target_link_libraries(comm_worker PRIVATE deepspeed)
target_compile_definitions(test_comm PRIVATE
  DS_MPIEXEC="${MPIEXEC_EXECUTABLE}" DS_MPIEXEC_NUMPROC_FLAG="${MPIEXEC_NUMPROC_FLAG}"
  DS_COMM_WORKER="$<TARGET_FILE:comm_worker>")

# A short deadline, so that a broken test fails in a minute instead of hanging for 300 s.
set(DS_COMM_TEST_ENV "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=60")
add_test(NAME test_comm COMMAND test_comm)
set_tests_properties(test_comm PROPERTIES LABELS "distributed;comm" TIMEOUT 300
  ENVIRONMENT "${DS_COMM_TEST_ENV}")
if(DS_HAVE_MPI)
  foreach(np 2 4)
    add_test(NAME test_comm_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
      --oversubscribe --allow-run-as-root $<TARGET_FILE:test_comm>)
    set_tests_properties(test_comm_np${np} PROPERTIES LABELS "distributed;comm" TIMEOUT 300
      ENVIRONMENT "${DS_COMM_TEST_ENV}")
    add_test(NAME test_comm_np${np}_mpi COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
      --oversubscribe --allow-run-as-root $<TARGET_FILE:test_comm>)
    set_tests_properties(test_comm_np${np}_mpi PROPERTIES LABELS "distributed;comm" TIMEOUT 300
      ENVIRONMENT "${DS_COMM_TEST_ENV};DS_COMM_SHM=0")
  endforeach()
endif()
