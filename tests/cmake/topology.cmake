# The 3D process grid (src/comm/topology.cpp). test_topology runs plainly (the Grid arithmetic for
# every factorisation of 1, 2, 4 and 8 ranks, and the splits on a size-1 world; the multi-rank
# cases skip) and under mpirun with 4 ranks, where every factorisation's groups are checked by
# all-reduce and all-gather. CI has 2 cores and runs as root: --oversubscribe and
# --allow-run-as-root. Small shared-memory slots: each of the 24 groups keeps its own until exit.
ds_add_test(test_topology LABELS comm SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_topology.cpp
            TIMEOUT 120)
if(DS_HAVE_MPI)
  add_test(NAME test_topology_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4
    --oversubscribe --allow-run-as-root $<TARGET_FILE:test_topology>)
  set_tests_properties(test_topology_np4 PROPERTIES LABELS "distributed;comm" TIMEOUT 300
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=60;DS_COMM_SHM_SLOT_KIB=64")
endif()
