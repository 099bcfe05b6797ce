# Fine-tuning: Hugging Face tokenizers (tokenizer.json, vocab/merges, SentencePiece), their export,
# chat templates. Fixtures from tests/fixtures/generators/gen_hf_tokenizer_fixtures.py. Label: finetune.
ds_add_test(test_hf_tokenizer LABELS finetune data families
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_tokenizer.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/test_wordpiece_tokenizer.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/test_unigram_tokenizer.cpp)
ds_add_test(test_chat_template LABELS finetune data
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_chat_template.cpp)
# ds_to_fp32 (DeepSpeed's zero_to_fp32): checkpoints of ZeRO stages 0, 2, 3 in fp32 and bf16
# consolidate into exactly the master weights; the tool's file and HF outputs; damaged checkpoints.
# Also under mpirun with 2 ranks (stage 3 shards from two ranks). Labels: finetune, train.
ds_add_test(test_to_fp32 LABELS finetune train families
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_to_fp32.cpp)
target_compile_definitions(test_to_fp32 PRIVATE DS_TO_FP32_BIN="$<TARGET_FILE:ds_to_fp32>")
add_dependencies(test_to_fp32 ds_to_fp32)
if(DS_HAVE_MPI)
  add_test(NAME test_to_fp32_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
    --oversubscribe --allow-run-as-root $<TARGET_FILE:test_to_fp32>)
  set_tests_properties(test_to_fp32_np2 PROPERTIES LABELS "finetune;train;distributed" TIMEOUT 600
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
endif()
# Supervised fine-tuning data (sft.h): the three JSONL formats, loss masks, padding, truncation,
# mask shards through TokenDataset/DataLoader, and ds_prepare --sft + ds_train end to end.
ds_add_test(test_sft LABELS finetune data SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_sft.cpp)
target_compile_definitions(test_sft PRIVATE DS_TRAIN_BIN="$<TARGET_FILE:ds_train>"
  DS_PREPARE_BIN="$<TARGET_FILE:ds_prepare>")
add_dependencies(test_sft ds_train ds_prepare)
# A model family's workflow end to end: ds_prepare --sft -> ds_train --init_from a Hugging Face folder
# of the family -> its export served (in process) to the guide's POST /. Label: families.
ds_add_test(test_family_workflow LABELS families finetune serve
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_family_workflow.cpp)
target_link_libraries(test_family_workflow PRIVATE ds_serve_http)
target_compile_definitions(test_family_workflow PRIVATE DS_TRAIN_BIN="$<TARGET_FILE:ds_train>"
  DS_PREPARE_BIN="$<TARGET_FILE:ds_prepare>")
add_dependencies(test_family_workflow ds_train ds_prepare)
