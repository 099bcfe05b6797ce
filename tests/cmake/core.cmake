ds_add_test(test_core LABELS core SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_core.cpp)
ds_add_test(test_gradcheck_basic LABELS gradcheck SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gradcheck_basic.cpp)
ds_add_test(test_autograd LABELS autograd SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_autograd.cpp)
# Docs and code cite files in the repository or upstream sources, never notes outside it.
add_test(NAME citations COMMAND ${CMAKE_COMMAND} -DDS_SOURCE_DIR=${PROJECT_SOURCE_DIR}
  -P ${CMAKE_CURRENT_SOURCE_DIR}/check_citations.cmake)
set_tests_properties(citations PROPERTIES LABELS "core")
# docs/architecture.md's "Where is X" table names files that exist.
add_test(NAME where_is COMMAND ${CMAKE_COMMAND} -DDS_SOURCE_DIR=${PROJECT_SOURCE_DIR}
  -P ${CMAKE_CURRENT_SOURCE_DIR}/check_where_is.cmake)
set_tests_properties(where_is PROPERTIES LABELS "core")
