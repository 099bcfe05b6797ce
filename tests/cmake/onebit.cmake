# The 1-bit optimizers (optim/onebit.h) and the compressed all-reduce (comm/compressed.h):
# test_onebit plainly (a size-1 world) and under mpirun with 2 and 4 ranks (oversubscribed on
# CI's 2 cores). Label: distributed.
add_executable(test_onebit ${CMAKE_CURRENT_SOURCE_DIR}/test_onebit.cpp)
target_link_libraries(test_onebit PRIVATE deepspeed GTest::gtest GTest::gtest_main)
add_test(NAME test_onebit COMMAND test_onebit)
set_tests_properties(test_onebit PROPERTIES LABELS "optim;onebit" TIMEOUT 300)
if(DS_HAVE_MPI)
  foreach(np 2 4)
    add_test(NAME test_onebit_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
      --oversubscribe --allow-run-as-root $<TARGET_FILE:test_onebit>)
    set_tests_properties(test_onebit_np${np} PROPERTIES LABELS "distributed;optim;onebit"
      TIMEOUT 600 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
  endforeach()
endif()
