# Encoder-decoders' workflow (label families): seq2seq data (JSONL records and their errors,
# transformers' truncation against tests/fixtures/seq2seq, the DSSEQ2SEQ set) and corpus BLEU
# against sacreBLEU (tests/fixtures/bleu).
ds_add_test(test_seq2seq_data LABELS families data
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_seq2seq_data.cpp)
# Training a tiny BART through the library's Seq2SeqTrainer (train, evaluate with BLEU, resume,
# export) and ds_prepare / ds_train / ds_generate as processes.
ds_add_test(test_seq2seq_train LABELS families train
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_seq2seq_train.cpp)
target_compile_definitions(test_seq2seq_train PRIVATE DS_TRAIN_BIN="$<TARGET_FILE:ds_train>"
  DS_PREPARE_BIN="$<TARGET_FILE:ds_prepare>" DS_GENERATE_BIN="$<TARGET_FILE:ds_generate>")
add_dependencies(test_seq2seq_train ds_train ds_prepare ds_generate)
# With MPI, a seq2seq model also trains on 2 ranks through the deepspeed launcher (ZeRO-3).
if(DS_HAVE_MPI)
  target_compile_definitions(test_seq2seq_train PRIVATE
    DS_LAUNCHER_EXE="$<TARGET_FILE:ds_launcher>")
  add_dependencies(test_seq2seq_train ds_launcher)
  set_tests_properties(test_seq2seq_train PROPERTIES LABELS "families;train;distributed"
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120")
endif()
