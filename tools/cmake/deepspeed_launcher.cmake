# deepspeed: the launcher (see docs/launcher.md). The target is ds_launcher because the library
# already owns the name `deepspeed`; the binary is still called deepspeed. It needs only fmt and
# CLI11 (header-only), not the library, so it builds even while a library layer is being rewritten.
set(DS_LAUNCHER_SRC
  ${CMAKE_CURRENT_SOURCE_DIR}/launcher/plan.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/launcher/run.cpp
  ${PROJECT_SOURCE_DIR}/src/core/text.cpp)  # BOMs, host-name comparison; depends on fmt only
add_executable(ds_launcher ${CMAKE_CURRENT_SOURCE_DIR}/deepspeed.cpp ${DS_LAUNCHER_SRC})
set_target_properties(ds_launcher PROPERTIES OUTPUT_NAME deepspeed)
target_include_directories(ds_launcher PRIVATE ${PROJECT_SOURCE_DIR}/include
  ${CMAKE_CURRENT_SOURCE_DIR}/launcher)
target_link_libraries(ds_launcher PRIVATE fmt::fmt)
target_compile_options(ds_launcher PRIVATE -Wall -Wextra)
