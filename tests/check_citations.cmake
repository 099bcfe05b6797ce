# Docs and code cite only files in this repository or upstream sources by their path there
# ("DeepSpeed's deepspeed/runtime/zero/stage3.py"): notes kept outside the repository
# (`reference/*.md`, "reference §6") mean nothing to a reader of a clone. Fails, naming every file
# and line, when src/, include/, tools/, docs/ or README.md cite them.
#
#   cmake -DDS_SOURCE_DIR=<repo> -P tests/check_citations.cmake
if(NOT DS_SOURCE_DIR)
  message(FATAL_ERROR "[citations] run with -DDS_SOURCE_DIR=<repository root>")
endif()

# Files whose citations are being rewritten on another branch: reported, not failed. Keep empty;
# add an entry only while such a branch is open, and remove it when it lands.
set(pending "")

set(pattern "reference/|reference §")
file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE ${DS_SOURCE_DIR}
  ${DS_SOURCE_DIR}/src/* ${DS_SOURCE_DIR}/include/* ${DS_SOURCE_DIR}/tools/*
  ${DS_SOURCE_DIR}/docs/*)
list(APPEND files README.md)
set(bad "")
foreach(f ${files})
  if(f MATCHES "\\.(png|jpg|jpeg|gif|ico|pdf|gz|bin|safetensors|pyc)$" OR f MATCHES "__pycache__/")
    continue()
  endif()
  file(STRINGS ${DS_SOURCE_DIR}/${f} hits REGEX "${pattern}")
  if(NOT hits)
    continue()
  endif()
  list(FIND pending ${f} is_pending)
  foreach(line ${hits})
    if(is_pending GREATER -1)
      message(STATUS "[citations] pending (owned elsewhere): ${f}: ${line}")
    else()
      string(APPEND bad "  ${f}: ${line}\n")
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "[citations] these cite notes outside the repository; cite the upstream "
    "source (e.g. DeepSpeed's deepspeed/runtime/zero/stage3.py) or a file in this repository "
    "instead:\n${bad}")
endif()
list(LENGTH files n)
message(STATUS "[citations] ${n} files checked")
