# ds_generate (one completion on the command line) and ds_serve (HTTP). The HTTP server is a small
# library of its own so that tests can start it in-process; cpp-httplib comes from Debian's
# libcpp-httplib-dev, whose split build needs its pkg-config flags (CPPHTTPLIB_*_SUPPORT) to match
# the compiled library's class layout.
add_executable(ds_generate ${CMAKE_CURRENT_SOURCE_DIR}/ds_generate.cpp)
target_link_libraries(ds_generate PRIVATE deepspeed)

pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# The chat page of GET / (serve/chat.html) becomes a string in the binary; editing the page
# re-runs this step.
file(READ ${CMAKE_CURRENT_SOURCE_DIR}/serve/chat.html DS_CHAT_HTML)
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/serve/chat_page.cpp.in
  ${CMAKE_CURRENT_BINARY_DIR}/serve/chat_page.cpp @ONLY)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/serve/chat.html)
add_library(ds_serve_http STATIC ${CMAKE_CURRENT_SOURCE_DIR}/serve/server.cpp
  ${CMAKE_CURRENT_BINARY_DIR}/serve/chat_page.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/serve/admission.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/serve/http_server.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/serve/request_reader.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/serve/metrics.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/serve/connection.cpp)
target_include_directories(ds_serve_http PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(ds_serve_http PUBLIC deepspeed PkgConfig::CPP_HTTPLIB)
add_executable(ds_serve ${CMAKE_CURRENT_SOURCE_DIR}/ds_serve.cpp)
target_link_libraries(ds_serve PRIVATE ds_serve_http)
