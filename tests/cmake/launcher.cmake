# The `deepspeed` launcher (tools/deepspeed.cpp, tools/launcher/). The test compiles the launcher's
# sources itself for the pure functions and runs the built tool (ds_launcher) end to end with the
# local and the openmpi launcher (OpenMPI's mpirun must be installed). Label: launcher.
#
# Not ds_add_test: like the tool, the test needs only fmt and GoogleTest, not libdeepspeed, so the
# launcher builds and is tested even while a library layer is mid-change.
add_executable(test_launcher
  ${CMAKE_CURRENT_SOURCE_DIR}/test_launcher.cpp
  ${PROJECT_SOURCE_DIR}/tools/launcher/plan.cpp
  ${PROJECT_SOURCE_DIR}/tools/launcher/run.cpp
  ${PROJECT_SOURCE_DIR}/src/core/text.cpp)
target_include_directories(test_launcher PRIVATE ${PROJECT_SOURCE_DIR}/include
  ${PROJECT_SOURCE_DIR}/tools/launcher)
target_link_libraries(test_launcher PRIVATE fmt::fmt GTest::gtest GTest::gtest_main)
target_compile_definitions(test_launcher PRIVATE DS_LAUNCHER_EXE="$<TARGET_FILE:ds_launcher>")
add_dependencies(test_launcher ds_launcher)
add_test(NAME test_launcher COMMAND test_launcher)
set_tests_properties(test_launcher PROPERTIES LABELS launcher TIMEOUT 300)

# Two nodes on one machine: the launcher reads a hostfile of two made-up hosts and mpirun starts each
# "node" through a stand-in for ssh (tests/fixtures/launcher/fake_ssh.sh). The ranks see two nodes
# (no shared-memory collectives, CROSS_SIZE 2), so this covers the multi-node path end to end:
# hostfile -> mpirun --host -> per-node rank variables -> collectives and ZeRO across nodes.
if(DS_HAVE_MPI)
  set(DS_TWO_NODES ${PROJECT_SOURCE_DIR}/tests/fixtures/launcher)
  foreach(prog test_comm test_zero)
    add_test(NAME ${prog}_two_nodes COMMAND $<TARGET_FILE:ds_launcher> -H ${DS_TWO_NODES}/two_nodes.hostfile
      --no_local_rank "--launcher_args=--mca plm_rsh_agent ${DS_TWO_NODES}/fake_ssh.sh --oversubscribe"
      $<TARGET_FILE:${prog}>)
    set_tests_properties(${prog}_two_nodes PROPERTIES LABELS "launcher;distributed" TIMEOUT 900
      ENVIRONMENT "DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
  endforeach()
endif()

# The Slurm path: salloc + `deepspeed --launcher slurm` (srun, MPI through PMIx). Skips unless a
# Slurm cluster answers here (scripts/slurm_local.sh starts a one-node one; CI does, via
# DS_TEST_SLURM=1 in scripts/test.sh).
if(DS_HAVE_MPI)
  add_test(NAME launcher_slurm COMMAND ${PROJECT_SOURCE_DIR}/tests/slurm_launch.sh
    $<TARGET_FILE:ds_launcher> $<TARGET_FILE:test_comm> $<TARGET_FILE:test_zero>)
  set_tests_properties(launcher_slurm PROPERTIES LABELS "launcher;distributed" TIMEOUT 1300
    SKIP_RETURN_CODE 77 ENVIRONMENT "DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
endif()
