# Inference and serving (ds/serve, tools/serve): KV-cache generation against the full forward,
# sampling, request parsing, and the HTTP server started in-process on an ephemeral port with a tiny
# model built in the test (no downloads, no Python).
ds_add_test(test_serve LABELS serve SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_serve.cpp)
# test_serve_seq2seq.cpp: encoder-decoders (models::Seq2SeqDecoder on the tests/fixtures/hf_families
# BART / BlenderBot / T5 cases, and ds_serve over a tiny BART built in the test).
ds_add_test(test_serve_http LABELS serve families SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_serve_http.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/test_serve_seq2seq.cpp)
target_link_libraries(test_serve_http PRIVATE ds_serve_http)
# ds_serve and ds_generate as programs: SIGTERM drains (new requests refused, in-flight ones
# finish, exit 0); the served answers equal ds_generate's.
ds_add_test(test_serve_drain LABELS serve SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_serve_drain.cpp)
target_link_libraries(test_serve_drain PRIVATE ds_serve_http)
target_compile_definitions(test_serve_drain PRIVATE DS_SERVE_BIN="$<TARGET_FILE:ds_serve>"
  DS_GENERATE_BIN="$<TARGET_FILE:ds_generate>")
add_dependencies(test_serve_drain ds_serve ds_generate)
