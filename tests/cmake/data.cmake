# Data pipeline: tokenizer (needs scripts/fetch_data.sh's files; the test runs it when they are
# missing), shards, memory-mapped dataset, distributed sampler, loader. Label: data.
ds_add_test(test_tokenizer LABELS data SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_tokenizer.cpp)
ds_add_test(test_data LABELS data SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_data.cpp)
