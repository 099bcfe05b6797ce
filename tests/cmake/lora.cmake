# LoRA (nn/lora.h, models/peft_io.h) and frozen parameters under ZeRO stages 0-3: gradient check,
# parity with peft (tests/fixtures/lora from tests/fixtures/generators/gen_lora_fixture.py; encoder classifiers and
# encoder-decoders: tests/fixtures/lora_classifier, lora_seq2seq from
# tests/fixtures/generators/gen_lora_classifier_fixture.py), PEFT adapter and merged export, stage agreement and bitwise
# resume. Plainly and under mpirun with 2 ranks.
# Labels: finetune, train (train puts it in scripts/test.sh's sanitizer pass).
ds_add_test(test_lora LABELS finetune train families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_lora.cpp)
if(DS_HAVE_MPI)
  add_test(NAME test_lora_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
    --oversubscribe --allow-run-as-root $<TARGET_FILE:test_lora>)
  set_tests_properties(test_lora_np2 PROPERTIES LABELS "finetune;train;distributed;families" TIMEOUT 600
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
endif()

# LoRA on the stacked experts of a mixture of experts (nn/expert_lora.h) against peft's
# target_parameters (tests/fixtures/lora_moe from tests/fixtures/generators/gen_moe_lora_fixture.py).
ds_add_test(test_lora_experts LABELS finetune train families
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_lora_experts.cpp)
if(DS_HAVE_MPI)
  add_test(NAME test_lora_experts_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
    --oversubscribe --allow-run-as-root $<TARGET_FILE:test_lora_experts>)
  set_tests_properties(test_lora_experts_np2 PROPERTIES LABELS "finetune;train;distributed;families"
    TIMEOUT 600 ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
endif()
