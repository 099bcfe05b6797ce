# ZeRO across ranks: test_zero under mpirun with 2 and 4 ranks (oversubscribed on CI's 2 cores),
# and once plainly (a size-1 world: the partition arithmetic and the stage logic at N = 1).
add_executable(test_zero ${CMAKE_CURRENT_SOURCE_DIR}/test_zero.cpp)
target_link_libraries(test_zero PRIVATE deepspeed GTest::gtest GTest::gtest_main)
add_test(NAME test_zero COMMAND test_zero)
set_tests_properties(test_zero PROPERTIES LABELS "zero;zero_memory" TIMEOUT 600)
if(DS_HAVE_MPI)
  foreach(np 2 4)
    add_test(NAME test_zero_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
      --oversubscribe --allow-run-as-root $<TARGET_FILE:test_zero>)
    set_tests_properties(test_zero_np${np} PROPERTIES LABELS "distributed;zero;zero_memory" TIMEOUT 900
      ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
  endforeach()
endif()

# ZeRO++ (qwZ, hpZ) and its quantizer: plainly (the quantizer) and under mpirun with 2 and 4 ranks.
add_executable(test_zeropp ${CMAKE_CURRENT_SOURCE_DIR}/test_zeropp.cpp)
target_link_libraries(test_zeropp PRIVATE deepspeed GTest::gtest GTest::gtest_main)
add_test(NAME test_zeropp COMMAND test_zeropp)
set_tests_properties(test_zeropp PROPERTIES LABELS "zero" TIMEOUT 300)
if(DS_HAVE_MPI)
  foreach(np 2 4)
    add_test(NAME test_zeropp_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
      --oversubscribe --allow-run-as-root $<TARGET_FILE:test_zeropp>)
    set_tests_properties(test_zeropp_np${np} PROPERTIES LABELS "distributed;zero" TIMEOUT 600
      ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
  endforeach()
endif()

# The one memory model (zero/memory_model.h) against real engines' memory, plainly and at 2 ranks.
add_executable(test_memory_model ${CMAKE_CURRENT_SOURCE_DIR}/test_memory_model.cpp)
target_link_libraries(test_memory_model PRIVATE deepspeed GTest::gtest GTest::gtest_main)
add_test(NAME test_memory_model COMMAND test_memory_model)
set_tests_properties(test_memory_model PROPERTIES LABELS "zero;zero_memory" TIMEOUT 300)
if(DS_HAVE_MPI)
  add_test(NAME test_memory_model_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
    --oversubscribe --allow-run-as-root $<TARGET_FILE:test_memory_model>)
  set_tests_properties(test_memory_model_np2 PROPERTIES LABELS "distributed;zero;zero_memory"
    TIMEOUT 300 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
endif()

# DeepSpeed's memory estimator against DeepSpeed's own numbers (tests/fixtures/zero/estimates.json).
ds_add_test(test_estimate LABELS zero SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_estimate.cpp)
# The ds_estimate tool end to end on DeepSpeed's documented example (bigscience/T0_3B, 1 x 1 GPU).
add_test(NAME ds_estimate_t0_3b COMMAND $<TARGET_FILE:ds_estimate> --stage 3 --params 2783959040
  --largest_layer 65798144)
set_tests_properties(ds_estimate_t0_3b PROPERTIES LABELS "zero"
  PASS_REGULAR_EXPRESSION "   70.00GB \\|   0.25GB \\| offload_param=cpu , offload_optimizer=cpu , zero_init=1")
# A config's count past --params' bound is refused (the tables' 64-bit byte counts would wrap), and
# a long context (block_size 1e12: GPT-2's wpe is the largest layer) is counted, not built.
add_test(NAME ds_estimate_refuses_a_huge_count COMMAND $<TARGET_FILE:ds_estimate> --stage 3
  --model ${DS_FIXTURE_DIR}/zero/model_too_many_params.json)
set_tests_properties(ds_estimate_refuses_a_huge_count PROPERTIES LABELS "zero"
  PASS_REGULAR_EXPRESSION "5.15e\\+16 parameters \\(n_layer 1000000, n_embd 65536.*more than the 1.13e\\+15 this estimator takes")
add_test(NAME ds_estimate_long_context COMMAND $<TARGET_FILE:ds_estimate> --stage 3
  --model ${DS_FIXTURE_DIR}/zero/model_long_context.json)
set_tests_properties(ds_estimate_long_context PROPERTIES LABELS "zero"
  PASS_REGULAR_EXPRESSION "Model with 32000000M total params, 32000000M largest layer params")
# An encoder-decoder from its config.json alone: bigscience/T0_3B's (t5, gated-gelu, untied lm_head:
# the DeepSpeed guide's 2783M counts lm_head tied, the loaded checkpoint has 32128 x 2048 more).
add_test(NAME ds_estimate_t5_folder COMMAND $<TARGET_FILE:ds_estimate> --stage 3
  --model ${DS_FIXTURE_DIR}/zero/t0_3b)
set_tests_properties(ds_estimate_t5_folder PROPERTIES LABELS "zero"
  PASS_REGULAR_EXPRESSION "Model with 2849M total params, 65M largest layer params")
# A mixture of experts from its config.json (Mixtral-8x7B): the tables take the total (46.7B; the
# largest layer is one block's 8 experts, 8 x 3 x 14336 x 4096),
# a line under them gives the active count per token (2 of 8 experts).
add_test(NAME ds_estimate_moe_folder COMMAND $<TARGET_FILE:ds_estimate> --stage 3
  --model ${DS_FIXTURE_DIR}/zero/moe/mixtral_8x7b)
set_tests_properties(ds_estimate_moe_folder PROPERTIES LABELS "zero"
  PASS_REGULAR_EXPRESSION "Model with 46702M total params, 1409M largest layer params.*Mixture of experts: 46702792704 total params \\(the memory above\\), 12879925248 active per token \\(2 of 8 experts per layer\\)")
