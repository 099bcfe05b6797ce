ds_add_test(test_core LABELS core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_core.cpp)
ds_add_test(test_gradcheck_basic LABELS gradcheck SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gradcheck_basic.cpp)
ds_add_test(test_autograd LABELS autograd SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_autograd.cpp)
