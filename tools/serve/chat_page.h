#pragma once
// The chat page ds_serve answers GET / with: one self-contained HTML file (tools/serve/chat.html;
// no external scripts, styles or fonts) that talks to POST /v1/chat/completions with
// "stream": true and shows the answer as it streams. CMake embeds the file into the binary
// (tools/cmake/ds_serve.cmake), so the server reads no file at run time.
//
// Opening /?q=TEXT sends TEXT at once (scripts/check_chat_page.sh drives headless Chromium so).
#include <string_view>

namespace ds::serve {

std::string_view chat_page_html();

}  // namespace ds::serve
