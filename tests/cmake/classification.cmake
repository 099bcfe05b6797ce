# Encoder classifiers' workflow (label families): classification data (GLUE TSV / JSONL parsing
# and errors, HF longest_first truncation against tests/fixtures/classification, the DSCLASSIFY
# set) and accuracy / F1; then training a tiny BERT through the library's ClassifierTrainer
# (train, evaluate, resume, export) and one ds_train process.
ds_add_test(test_classification LABELS families data
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_classification.cpp)
# ds_prepare --task classification as a program on a DeBERTa-v2 (Unigram) tokenizer folder.
target_compile_definitions(test_classification PRIVATE DS_PREPARE_BIN="$<TARGET_FILE:ds_prepare>")
add_dependencies(test_classification ds_prepare)
ds_add_test(test_classifier_train LABELS families train
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_classifier_train.cpp)
target_compile_definitions(test_classifier_train PRIVATE DS_TRAIN_BIN="$<TARGET_FILE:ds_train>"
  DS_PREPARE_BIN="$<TARGET_FILE:ds_prepare>")
add_dependencies(test_classifier_train ds_train ds_prepare)
# With MPI, a classifier also trains on 2 ranks through the deepspeed launcher (ZeRO-3).
if(DS_HAVE_MPI)
  target_compile_definitions(test_classifier_train PRIVATE
    DS_LAUNCHER_EXE="$<TARGET_FILE:ds_launcher>")
  add_dependencies(test_classifier_train ds_launcher)
  set_tests_properties(test_classifier_train PROPERTIES LABELS "families;train;distributed"
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DS_COMM_TIMEOUT=120")
endif()
