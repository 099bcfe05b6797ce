# docs/architecture.md's "Where is X" table points at files: every path it names must exist, so the
# table cannot rot when code moves. A path is a backticked word that starts with one of the tree's
# folders (src/, include/, tools/, tests/, bench/, scripts/, docs/); `a.{h,cpp}` stands for a.h and
# a.cpp; a placeholder (`families/<family>.cpp`) checks its folder. Fails naming every missing path
# and the row that names it.
#
#   cmake -DDS_SOURCE_DIR=<repo> -P tests/check_where_is.cmake
if(NOT DS_SOURCE_DIR)
  message(FATAL_ERROR "[where-is] run with -DDS_SOURCE_DIR=<repository root>")
endif()

set(doc ${DS_SOURCE_DIR}/docs/architecture.md)
file(STRINGS ${doc} lines)
set(in_table FALSE)
set(checked 0)
set(missing "")
foreach(line IN LISTS lines)
  if(line MATCHES "^\\| what \\| where \\|")
    set(in_table TRUE)
    continue()
  endif()
  if(NOT in_table)
    continue()
  endif()
  if(NOT line MATCHES "^\\|")
    set(in_table FALSE)  # the table ended; a later "| what | where |" starts another
    continue()
  endif()
  string(REGEX MATCHALL "`(src|include|tools|tests|bench|scripts|docs)/[^` ]*`" paths "${line}")
  foreach(p IN LISTS paths)
    string(REGEX REPLACE "^`|`$" "" p "${p}")
    string(REGEX REPLACE "[(:].*$" "" p "${p}")  # `file.cpp` (`fn()`) or path:line
    set(expanded "${p}")
    if(p MATCHES "^(.*)\\{([^}]*)\\}(.*)$")
      set(pre "${CMAKE_MATCH_1}")
      set(alts "${CMAKE_MATCH_2}")
      set(post "${CMAKE_MATCH_3}")
      string(REPLACE "," ";" alts "${alts}")
      set(expanded "")
      foreach(a IN LISTS alts)
        list(APPEND expanded "${pre}${a}${post}")
      endforeach()
    endif()
    foreach(e IN LISTS expanded)
      if(e MATCHES "<")  # a placeholder (`src/models/families/<family>.cpp`): its folder must exist
        string(REGEX REPLACE "/[^/]*<.*$" "" e "${e}")
      endif()
      math(EXPR checked "${checked} + 1")
      if(NOT EXISTS ${DS_SOURCE_DIR}/${e})
        string(SUBSTRING "${line}" 0 90 row)
        list(APPEND missing "  ${e}   (row: ${row}...)")
      endif()
    endforeach()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "[where-is] no paths found in ${doc}'s \"| what | where |\" table")
endif()
if(missing)
  list(JOIN missing "\n" text)
  message(FATAL_ERROR "[where-is] docs/architecture.md names paths that do not exist; "
                      "update the table where the code moved:\n${text}")
endif()
message(STATUS "[where-is] ${checked} paths in docs/architecture.md's table exist")
