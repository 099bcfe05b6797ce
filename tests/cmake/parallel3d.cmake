# Tensor parallelism (src/nn/tensor_parallel.cpp): test_tensor_parallel plainly (tp = 1) and under
# mpirun with 2 and 4 ranks (tp = 2; tp = 4 and tp = 2 x dp = 2), oversubscribed on CI's 2 cores.
ds_add_test(test_tensor_parallel LABELS parallel3d SOURCES
            ${CMAKE_CURRENT_SOURCE_DIR}/test_tensor_parallel.cpp TIMEOUT 300)
if(DS_HAVE_MPI)
  foreach(np 2 4)
    add_test(NAME test_tensor_parallel_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG}
      ${np} --oversubscribe --allow-run-as-root $<TARGET_FILE:test_tensor_parallel>)
    set_tests_properties(test_tensor_parallel_np${np} PROPERTIES LABELS "distributed;parallel3d"
      TIMEOUT 600 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
  endforeach()
endif()
# Pipeline parallelism (src/runtime/pipeline_engine.cpp, pipeline_schedule.cpp, GPT stages):
# schedules against DeepSpeed's and stages chained by hand plainly; training against one process
# under mpirun with 2 ranks (pp=2), 4 (pp=4; pp=2 x dp=2; pp=2 x tp=2) and 8 (pp=2 x tp=2 x dp=2).
ds_add_test(test_pipeline LABELS parallel3d SOURCES
            ${CMAKE_CURRENT_SOURCE_DIR}/test_pipeline.cpp TIMEOUT 300)
if(DS_HAVE_MPI)
  foreach(np 2 4 8)
    add_test(NAME test_pipeline_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG}
      ${np} --oversubscribe --allow-run-as-root $<TARGET_FILE:test_pipeline>)
    set_tests_properties(test_pipeline_np${np} PROPERTIES LABELS "distributed;parallel3d"
      TIMEOUT 900 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
  endforeach()
endif()
# Pipeline layer partitioning (src/runtime/pipeline_partition.cpp) against DeepSpeed's results.
ds_add_test(test_pipeline_partition LABELS parallel3d SOURCES
            ${CMAKE_CURRENT_SOURCE_DIR}/test_pipeline_partition.cpp TIMEOUT 60)
