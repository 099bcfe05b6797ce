# A BART-shaped models::Seq2Seq from a Hugging Face folder: training steps through runtime::Engine
# or beam search, timed. Run: bench/run_families.sh (beside transformers; bench/RESULTS.md).
add_executable(bench_seq2seq ${CMAKE_CURRENT_SOURCE_DIR}/bench_seq2seq.cpp)
target_link_libraries(bench_seq2seq PRIVATE deepspeed)
