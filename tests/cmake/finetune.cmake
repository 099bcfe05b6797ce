# Fine-tuning: Hugging Face tokenizers (tokenizer.json, vocab/merges, SentencePiece), their export,
# chat templates. Fixtures from tools/gen_hf_tokenizer_fixtures.py. Label: finetune.
ds_add_test(test_hf_tokenizer LABELS finetune data
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_hf_tokenizer.cpp)
ds_add_test(test_chat_template LABELS finetune data
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_chat_template.cpp)
