# Encoder-decoders' workflow (label families): seq2seq data (JSONL records and their errors,
# transformers' truncation against tests/fixtures/seq2seq, the DSSEQ2SEQ set) and corpus BLEU
# against sacreBLEU (tests/fixtures/bleu).
ds_add_test(test_seq2seq_data LABELS families data
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_seq2seq_data.cpp)
