ds_add_test(test_engine LABELS precision resume checkpoint SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_engine.cpp)
