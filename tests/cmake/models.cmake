# Layers, models, the safetensors format and parity with PyTorch (tests/fixtures/parity, written by
# tests/fixtures/generators/gen_parity_fixture.py).
ds_add_test(test_safetensors LABELS core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_safetensors.cpp)
ds_add_test(test_parity LABELS parity SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_parity.cpp)
ds_add_test(test_nn LABELS core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_nn.cpp)
# LLaMA-family Hugging Face import/export against transformers (tests/fixtures/hf_families, written
# by tests/fixtures/generators/gen_hf_family_fixture.py).
ds_add_test(test_hf_families LABELS finetune parity families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_families.cpp)
# Mixture-of-experts decoders (Mixtral) against transformers (tests/fixtures/hf_families/mixtral*,
# written by tests/fixtures/generators/gen_hf_moe_fixture.py).
ds_add_test(test_hf_moe LABELS parity families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_moe.cpp)
# Mixture of experts under ZeRO data parallelism: plainly and under mpirun with 2 ranks.
ds_add_test(test_moe_dp LABELS parity families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_moe_dp.cpp)
if(DS_HAVE_MPI)
  add_test(NAME test_moe_dp_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
    --oversubscribe --allow-run-as-root $<TARGET_FILE:test_moe_dp>)
  set_tests_properties(test_moe_dp_np2 PROPERTIES LABELS "distributed;families" TIMEOUT 600
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
endif()
# Expert parallelism: one process (the all-to-all and the refusals' single-rank parts) and under
# mpirun with 2 and 4 ranks (equality with one process, empty experts, checkpoints).
ds_add_test(test_moe_ep LABELS families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_moe_ep.cpp)
if(DS_HAVE_MPI)
  foreach(np 2 4)
    add_test(NAME test_moe_ep_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
      --oversubscribe --allow-run-as-root $<TARGET_FILE:test_moe_ep>)
    set_tests_properties(test_moe_ep_np${np} PROPERTIES LABELS "distributed;families" TIMEOUT 900
      ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120;OMP_NUM_THREADS=1")
  endforeach()
endif()
# BERT / RoBERTa sequence classifiers against transformers (tests/fixtures/hf_families/{bert_cls,
# roberta_cls,bert_regression}, written by tests/fixtures/generators/gen_encoder_fixture.py).
ds_add_test(test_hf_encoders LABELS parity families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_encoders.cpp)
# DeBERTa-v2 sequence classifier against transformers (tests/fixtures/hf_families/deberta_*,
# written by tests/fixtures/generators/gen_deberta_fixture.py).
ds_add_test(test_hf_deberta LABELS parity families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_deberta.cpp)
# BART / BlenderBot / T5 encoder-decoders against transformers (tests/fixtures/hf_families/{bart_s2s,
# bart_relu_scaled,blenderbot_s2s,t5_relu_tied,t5_gated_untied}, by tests/fixtures/generators/gen_seq2seq_fixture.py).
ds_add_test(test_hf_seq2seq LABELS parity families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_seq2seq.cpp)
# bf16 against PyTorch's own bf16 (tests/fixtures/parity/*_bf16, written by
# tests/fixtures/generators/gen_bf16_parity_fixture.py) and 100 bf16 training steps against fp32.
ds_add_test(test_bf16_parity LABELS parity precision SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bf16_parity.cpp)
