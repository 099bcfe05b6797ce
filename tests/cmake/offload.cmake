# NVMe offload: the aio layer and the optimizer state on NVMe, plainly and on 2 ranks (each rank
# has its own swap folder under one nvme_path; one rank's I/O failure must stop both).
ds_add_test(test_offload LABELS offload SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_offload.cpp)
if(DS_HAVE_MPI)
  add_test(NAME test_offload_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
    --oversubscribe --allow-run-as-root $<TARGET_FILE:test_offload>
    --gtest_filter=*Offload*)
  set_tests_properties(test_offload_np2 PROPERTIES LABELS "distributed;offload" TIMEOUT 900
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
endif()
# ds_io end to end on a small file (its numbers are benchmarks, not tested), and a bad flag.
add_test(NAME ds_io_smoke COMMAND $<TARGET_FILE:ds_io> --path ${CMAKE_CURRENT_BINARY_DIR} --size 64M --loops 1)
set_tests_properties(ds_io_smoke PROPERTIES LABELS "offload" PASS_REGULAR_EXPRESSION "BENCH ds_io op=read gbps=")
add_test(NAME ds_io_bad_block_size COMMAND $<TARGET_FILE:ds_io> --path ${CMAKE_CURRENT_BINARY_DIR} --block_size 1000)
set_tests_properties(ds_io_bad_block_size PROPERTIES LABELS "offload"
  PASS_REGULAR_EXPRESSION "--block_size 1000 is not a multiple of 4096")
