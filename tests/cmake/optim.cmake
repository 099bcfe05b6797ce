ds_add_test(test_optim LABELS optim parity SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_optim.cpp)

# Muon: the formulas against tests/fixtures/optim/muon_reference.json, the engine on one process,
# ZeRO 0-3 (and MiCS) on 2 and 4 ranks against one process.
add_executable(test_muon ${CMAKE_CURRENT_SOURCE_DIR}/test_muon.cpp)
target_link_libraries(test_muon PRIVATE deepspeed GTest::gtest GTest::gtest_main)
target_compile_definitions(test_muon PRIVATE DS_FIXTURE_DIR="${DS_FIXTURE_DIR}")
add_test(NAME test_muon COMMAND test_muon)
set_tests_properties(test_muon PROPERTIES LABELS "optim;zero" TIMEOUT 600)
if(DS_HAVE_MPI)
  foreach(np 2 4)
    add_test(NAME test_muon_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
      --oversubscribe --allow-run-as-root $<TARGET_FILE:test_muon>)
    set_tests_properties(test_muon_np${np} PROPERTIES LABELS "distributed;optim;zero" TIMEOUT 900
      ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
  endforeach()
endif()

# muP: mup's width multipliers and the MuAdam / MuAdamW / MuSGD optimizers.
ds_add_test(test_mup LABELS optim SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_mup.cpp)
