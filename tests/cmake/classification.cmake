# Encoder classifiers' workflow (label families): classification data (GLUE TSV / JSONL parsing
# and errors, HF longest_first truncation against tests/fixtures/classification, the DSCLASSIFY
# set) and accuracy / F1; then training a tiny BERT through the library's ClassifierTrainer
# (train, evaluate, resume, export) and one ds_train process.
ds_add_test(test_classification LABELS families data
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_classification.cpp)
