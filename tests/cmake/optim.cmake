ds_add_test(test_optim LABELS optim parity SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_optim.cpp)
